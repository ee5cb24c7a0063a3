// Runs in a rendered slide (page.evaluate, argument [width, height]); returns what the layout
// checks need. Coordinates are CSS pixels relative to the slide (the viewport), unscrolled.
([W, H]) => {
  const TOL = 1;  // sub-pixel rounding is not a layout problem
  const box = (r) => ({x: r.left, y: r.top, w: r.width, h: r.height});
  const outside = (r) => r.left < -TOL || r.top < -TOL || r.right > W + TOL || r.bottom > H + TOL;
  const label = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '');
  const clips = (st) => st.overflowX !== 'visible' || st.overflowY !== 'visible';
  // Text, grouped by the element that directly holds it.
  const groups = new Map();
  const walker = document.createTreeWalker(document.body || document.documentElement,
                                           NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const el = node.parentElement;
    if (!el || !node.textContent.trim()) continue;
    const st = getComputedStyle(el);
    if (st.display === 'none' || st.visibility !== 'visible' || parseFloat(st.opacity) === 0) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter((r) => r.width > 0 && r.height > 0);
    if (!rects.length) continue;
    let g = groups.get(el);
    if (!g) groups.set(el, g = {el, text: '', rects: [], font: parseFloat(st.fontSize)});
    g.text += node.textContent;
    g.rects.push(...rects);
  }
  const texts = [];
  for (const g of groups.values()) {
    const problems = [];
    if (g.rects.some(outside)) problems.push('off-slide');
    // An ancestor that clips (overflow other than visible) and cuts one of the text's lines.
    for (let a = g.el; a && a !== document.documentElement; a = a.parentElement) {
      if (!clips(getComputedStyle(a))) continue;
      const r = a.getBoundingClientRect();
      const left = r.left + a.clientLeft, top = r.top + a.clientTop;
      const cut = g.rects.some((t) => t.left < left - TOL || t.top < top - TOL ||
        t.right > left + a.clientWidth + TOL || t.bottom > top + a.clientHeight + TOL);
      if (cut) { problems.push('clipped by ' + label(a)); break; }
    }
    texts.push({el: label(g.el), text: g.text.replace(/\s+/g, ' ').trim().slice(0, 80),
                font_px: g.font, rects: g.rects.map(box), problems});
  }
  // Overlap: two text groups (neither inside the other) whose line boxes intersect.
  const overlaps = [];
  const list = [...groups.values()];
  for (let i = 0; i < list.length; i++) {
    for (let j = i + 1; j < list.length; j++) {
      const a = list[i], b = list[j];
      if (a.el.contains(b.el) || b.el.contains(a.el)) continue;
      let area = 0;
      for (const r of a.rects) for (const s of b.rects) {
        const w = Math.min(r.right, s.right) - Math.max(r.left, s.left);
        const h = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
        if (w > TOL && h > TOL) area += w * h;
      }
      if (area > 4) overlaps.push({a: label(a.el), b: label(b.el), area_px: Math.round(area)});
    }
  }
  // Overflow: the document is larger than the slide, or a rendered box sticks out of it.
  const root = document.documentElement;
  const overflow = [];
  if (root.scrollWidth > W + TOL || root.scrollHeight > H + TOL)
    overflow.push(`document ${root.scrollWidth}x${root.scrollHeight} > slide ${W}x${H}`);
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.height > 0 && outside(r)) {
      overflow.push(`${label(el)} at ${Math.round(r.left)},${Math.round(r.top)} ` +
                    `${Math.round(r.width)}x${Math.round(r.height)}`);
      if (overflow.length >= 10) break;
    }
  }
  return {text: (document.body ? document.body.innerText : '').replace(/\s+/g, ' ').trim(),
          texts, overlaps, overflow};
}

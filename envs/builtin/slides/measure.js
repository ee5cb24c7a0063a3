// Runs in a rendered slide (page.evaluate, argument [width, height, phrases]); returns what the
// layout checks need. Coordinates are CSS pixels relative to the slide (the viewport), unscrolled.
// Sizes are what the screen shows: a font size is the computed size times the scale every
// transform and zoom above the text applies (the element's drawn box over its layout box).
([W, H, phrases]) => {
  const TOL = 1;  // sub-pixel rounding is not a layout problem
  const MAX_OCCURRENCES = 8;  // per required phrase: where it is written, shown or not
  const box = (r) => ({x: r.left, y: r.top, w: r.width, h: r.height});
  const outside = (r) => r.left < -TOL || r.top < -TOL || r.right > W + TOL || r.bottom > H + TOL;
  const label = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '');
  const clips = (st) => st.overflowX !== 'visible' || st.overflowY !== 'visible';
  const SKIP = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'TITLE', 'TEXTAREA']);
  const rectsOf = (node, start, end) => {
    const range = document.createRange();
    range.setStart(node, start);
    range.setEnd(node, end);
    return [...range.getClientRects()].filter((r) => r.width > 0 && r.height > 0);
  };
  // The drawn size of an element over its layout size: < 1 under scale(), zoom, perspective.
  const scaleOf = (el) => {
    const r = el.getBoundingClientRect();
    const w = el.offsetWidth, h = el.offsetHeight;
    if (!(w > 0 && h > 0)) return 1;  // no layout box to compare (SVG): the ink check decides
    const scale = Math.min(r.width / w, r.height / h);
    return Number.isFinite(scale) ? scale : 0;  // a form's fields can shadow offsetWidth
  };
  const opacityOf = (el) => {
    let o = 1;
    for (let a = el; a; a = a.parentElement) o *= parseFloat(getComputedStyle(a).opacity);
    return o;
  };
  // The first ancestor that clips (overflow other than visible) and cuts one of `rects`.
  const clippedBy = (el, rects) => {
    for (let a = el; a && a !== document.documentElement; a = a.parentElement) {
      if (!clips(getComputedStyle(a))) continue;
      const r = a.getBoundingClientRect();
      const left = r.left + a.clientLeft, top = r.top + a.clientTop;
      if (rects.some((t) => t.left < left - TOL || t.top < top - TOL ||
          t.right > left + a.clientWidth + TOL || t.bottom > top + a.clientHeight + TOL))
        return a;
    }
    return null;
  };
  // Text nodes in document order, and text grouped by the element that directly holds it.
  const nodes = [];
  const groups = new Map();
  const walker = document.createTreeWalker(document.body || document.documentElement,
                                           NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const el = node.parentElement;
    if (!el || SKIP.has(el.tagName)) continue;
    nodes.push(node);
    if (!node.textContent.trim()) continue;
    const st = getComputedStyle(el);
    if (st.display === 'none' || st.visibility !== 'visible' || parseFloat(st.opacity) === 0) continue;
    const rects = rectsOf(node, 0, node.length);
    if (!rects.length) continue;
    let g = groups.get(el);
    if (!g) groups.set(el, g = {el, text: '', rects: [], font: parseFloat(st.fontSize) * scaleOf(el)});
    g.text += node.textContent;
    g.rects.push(...rects);
  }
  const texts = [];
  for (const g of groups.values()) {
    const problems = [];
    if (g.rects.some(outside)) problems.push('off-slide');
    const a = clippedBy(g.el, g.rects);
    if (a) problems.push('clipped by ' + label(a));
    texts.push({el: label(g.el), text: g.text.replace(/\s+/g, ' ').trim().slice(0, 80),
                font_px: Math.round(g.font * 100) / 100, rects: g.rects.map(box), problems});
  }
  // Overlap: two text groups (neither inside the other) whose line boxes intersect.
  const intersection = (r, s) => {
    const w = Math.min(r.right, s.right) - Math.max(r.left, s.left);
    const h = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
    return w > TOL && h > TOL ? w * h : 0;
  };
  const overlaps = [];
  const list = [...groups.values()];
  for (let i = 0; i < list.length; i++) {
    for (let j = i + 1; j < list.length; j++) {
      const a = list[i], b = list[j];
      if (a.el.contains(b.el) || b.el.contains(a.el)) continue;
      let area = 0;
      for (const r of a.rects) for (const s of b.rects) area += intersection(r, s);
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
          texts, overlaps, overflow, phrases: findPhrases(phrases)};

  // Where each required phrase is written (case and runs of white space ignored; text in
  // different blocks is apart), and for each place what geometry says about it: the line boxes
  // its letters occupy (render.js counts the pixels its glyphs change there), the smallest
  // on-screen font size, the accumulated opacity, problems (off the slide, cut by a box that
  // clips) and the line boxes of other text drawn over it (its pixels there are not its own).
  function findPhrases(wanted) {
    const flat = [];  // one entry per character of the normalised text: [node, offset] or null
    let s = '', lastBlock = null;
    const blockOf = (el) => {
      for (let a = el; a; a = a.parentElement) {
        const d = getComputedStyle(a).display;
        if (!d.startsWith('inline') && d !== 'contents') return a;
      }
      return null;
    };
    const push = (ch, at) => {
      if (/\s/.test(ch)) {  // a space is a gap between glyphs: nothing to see there
        if (s.endsWith(' ') || !s) return;
        ch = ' ';
        at = null;
      }
      for (const c of ch.toLowerCase()) { s += c; flat.push(at); }
    };
    for (const node of nodes) {
      const block = blockOf(node.parentElement);
      if (block !== lastBlock) push(' ', null);  // text of another block is not adjacent
      lastBlock = block;
      const t = node.textContent;
      for (let i = 0; i < t.length; i++) push(t[i], [node, i]);
    }
    return wanted.map((phrase) => {
      const needle = phrase.replace(/\s+/g, ' ').trim().toLowerCase();
      const found = [];
      for (let at = needle ? s.indexOf(needle) : -1; at >= 0 && found.length < MAX_OCCURRENCES;
           at = s.indexOf(needle, at + 1)) found.push(place(flat.slice(at, at + needle.length)));
      return {phrase, chars: needle.replace(/ /g, '').length, found};
    });
  }

  function place(chars) {
    const spans = new Map();  // node -> [first, last] offset of the phrase in it
    for (const at of chars) {
      if (!at) continue;
      const [node, i] = at;
      const span = spans.get(node);
      if (span) span[1] = i; else spans.set(node, [i, i]);
    }
    const rects = [], others = [], problems = new Set();
    let font = Infinity, opacity = 1;
    for (const [node, [first, last]] of spans) {
      const el = node.parentElement;
      const st = getComputedStyle(el);
      const mine = rectsOf(node, first, last + 1);
      if (st.visibility !== 'visible' || !mine.length) { problems.add('not rendered'); continue; }
      rects.push(...mine);
      font = Math.min(font, parseFloat(st.fontSize) * scaleOf(el));
      opacity = Math.min(opacity, opacityOf(el));
      if (mine.some(outside)) problems.add('off the slide');
      const a = clippedBy(el, mine);
      if (a) problems.add('cut by ' + label(a));
      for (const g of groups.values()) {
        if (g.el === el || g.el.contains(el) || el.contains(g.el)) continue;
        others.push(...g.rects.filter((r) => mine.some((m) => intersection(r, m) > 0)));
      }
    }
    return {rects: rects.map(box), others: others.map(box), font_px: font === Infinity ? 0 : Math.round(font * 100) / 100,
            opacity: Math.round(opacity * 1000) / 1000, problems: [...problems]};
  }
}

// Runs in a rendered slide (page.evaluate, argument true or false). true: every glyph of the
// document's text is painted transparent and nothing else changes (no layout, no box, no
// background, no decoration, no shadow), so a screenshot taken now differs from one taken
// before only where text was visibly drawn. false: the slide as it was.
// Inline !important on each element beats any rule of the slide's own; text painted through
// `background-clip: text` loses that background instead (its background shows only in glyphs).
(hide) => {
  const key = Symbol.for('envhub.unpaint');  // no id or name in the slide can shadow it
  const saved = (window[key] = window[key] || new Map());
  if (!hide) {
    for (const [el, style] of saved) {
      if (style === null) el.removeAttribute('style'); else el.setAttribute('style', style);
    }
    saved.clear();
    return;
  }
  const SVG = 'http://www.w3.org/2000/svg';
  for (const el of document.querySelectorAll('*')) {
    if (!el.style) continue;
    const st = getComputedStyle(el);
    saved.set(el, el.getAttribute('style'));
    el.style.setProperty('-webkit-text-fill-color', 'transparent', 'important');
    el.style.setProperty('-webkit-text-stroke-width', '0px', 'important');
    if (el.namespaceURI === SVG && ['text', 'tspan', 'textPath'].includes(el.localName)) {
      el.style.setProperty('fill', 'transparent', 'important');
      el.style.setProperty('stroke', 'transparent', 'important');
    }
    if (st.webkitBackgroundClip === 'text' || st.backgroundClip === 'text') {
      el.style.setProperty('background-image', 'none', 'important');
      el.style.setProperty('background-color', 'transparent', 'important');
    }
  }
}

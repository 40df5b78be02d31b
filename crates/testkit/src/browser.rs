//! Checks of the HTML report as a browser lays it out: a script appended to a copy of the
//! page measures what the DOM rendered, and leaves its result in the DOM `--dump-dom` prints.

/// Appended to a copy of the report (the report itself runs no script): every SVG label's
/// rendered box, compared pairwise and against the flow ladder's arrows, lifelines and stall
/// band edges; the result goes into the DOM that `--dump-dom` prints.
pub const LABEL_CHECK: &str = r#"<script>
(() => {
  const boxes = [...document.querySelectorAll('svg text')].map(t => ({
    svg: t.closest('svg').id || '?',
    text: [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.data).join(''),
    r: t.getBoundingClientRect(),
  })).filter(b => b.r.width > 0 && b.r.height > 0);
  const out = [];
  // Boxes of adjacent lines touch; an overlap is more than a pixel each way.
  const over = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 &&
                         Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
  for (let i = 0; i < boxes.length; i++)
    for (let j = i + 1; j < boxes.length; j++)
      if (over(boxes[i].r, boxes[j].r))
        out.push(boxes[i].svg + ': "' + boxes[i].text + '" / "' + boxes[j].text + '"');
  // A label that the line of a ladder's arrow, a lifeline or a stall band's edge runs
  // through (those classes, in any chart), in the page's coordinates; arrowheads and
  // stroke widths are not measured.
  const segs = [];
  for (const svg of document.querySelectorAll('svg')) {
    const m = svg.getScreenCTM();
    if (!m) continue;
    const pt = (x, y) => new DOMPoint(x, y).matrixTransform(m);
    const add = (a, b) => segs.push({ svg: svg.id || '?', a, b });
    for (const l of svg.querySelectorAll('line.pkt, line.lifeline')) {
      const v = n => parseFloat(l.getAttribute(n));
      add(pt(v('x1'), v('y1')), pt(v('x2'), v('y2')));
    }
    for (const r of svg.querySelectorAll('rect.stall')) {
      const v = n => parseFloat(r.getAttribute(n));
      const [x, y, w, h] = [v('x'), v('y'), v('width'), v('height')];
      add(pt(x, y), pt(x + w, y));
      add(pt(x, y + h), pt(x + w, y + h));
      add(pt(x, y), pt(x, y + h));
      add(pt(x + w, y), pt(x + w, y + h));
    }
  }
  // Whether segment a–b passes through rectangle r shrunk by a pixel (Liang–Barsky).
  const crosses = (a, b, r) => {
    const [x0, x1, y0, y1] = [r.left + 1, r.right - 1, r.top + 1, r.bottom - 1];
    if (x1 <= x0 || y1 <= y0) return false;
    const dx = b.x - a.x, dy = b.y - a.y;
    let t0 = 0, t1 = 1;
    for (const [p, q] of [[-dx, a.x - x0], [dx, x1 - a.x], [-dy, a.y - y0], [dy, y1 - a.y]]) {
      if (p === 0) { if (q < 0) return false; continue; }
      const t = q / p;
      if (p < 0) { if (t > t1) return false; if (t > t0) t0 = t; }
      else { if (t < t0) return false; if (t < t1) t1 = t; }
    }
    return t0 <= t1;
  };
  for (const b of boxes)
    for (const s of segs)
      if (s.svg === b.svg && crosses(s.a, s.b, b.r)) {
        out.push(b.svg + ': "' + b.text + '" is crossed by a line');
        break;
      }
  // Labels that leave their chart are cut off.
  for (const b of boxes) {
    const s = document.getElementById(b.svg);
    const c = s && s.getBoundingClientRect();
    if (c && (b.r.left < c.left - 1 || b.r.right > c.right + 1))
      out.push(b.svg + ': "' + b.text + '" leaves the chart');
  }
  const pre = document.createElement('pre');
  pre.id = 'label-check';
  pre.textContent = 'LABELS ' + boxes.length + '\n' + out.join('\n') + '\nEND';
  document.body.appendChild(pre);
})();
</script>"#;

/// `html` with [`LABEL_CHECK`] inserted before `</body>`.
pub fn with_label_check(html: &str) -> String {
    match html.rfind("</body>") {
        Some(i) => format!("{}{LABEL_CHECK}{}", &html[..i], &html[i..]),
        None => format!("{html}{LABEL_CHECK}"),
    }
}

/// From the DOM Chromium dumped: how many labels were measured, and each pair that overlaps
/// (or label cut off by its chart); `None` when the script did not run.
pub fn label_check_result(dom: &str) -> Option<(usize, Vec<String>)> {
    let mark = "<pre id=\"label-check\">LABELS ";
    let i = dom.find(mark)? + mark.len();
    let end = dom[i..].find("\nEND").map_or(dom.len(), |e| i + e);
    let mut lines = dom[i..end].lines();
    let n: usize = lines.next()?.trim().parse().ok()?;
    let bad = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.replace("&quot;", "\"")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&")
        })
        .collect();
    Some((n, bad))
}

//! Checks of the HTML report as a browser lays it out: a script appended to a copy of the
//! page measures what the DOM rendered, and leaves its result in the DOM `--dump-dom` prints.

/// Appended to a copy of the report (the report itself runs no script): every SVG label's
/// rendered box, compared pairwise; the result goes into the DOM that `--dump-dom` prints.
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

//! A flame graph of folded stacks as inline SVG, without scripts (the report has none):
//! each box a frame, its width its share of the samples, its callers below it (Brendan
//! Gregg's layout, as flamegraph.pl and inferno draw it: siblings in name order, so the
//! x axis is not time). A box's `<title>` gives its name and samples on hover.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use lagtrace_model::host::FoldedStack;

use crate::svg::esc;

/// The drawing's width, px.
const WIDTH: f64 = 960.0;
/// One frame's row, px.
const ROW: f64 = 16.0;
/// Boxes narrower than this are not drawn (their samples stay in their parent's width).
const MIN_PX: f64 = 0.5;
/// A monospace character at the label's size, px.
const CHAR_PX: f64 = 6.6;

#[derive(Default)]
struct Node {
    samples: u64,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn depth(&self) -> usize {
        1 + self.children.values().map(Node::depth).max().unwrap_or(0)
    }
}

/// The flame graph of `folded` (root first, `;`-joined frames), titled `title`; `None`
/// when there is no sample.
pub fn flame_graph(folded: &[FoldedStack], title: &str) -> Option<String> {
    let mut root = Node::default();
    for f in folded.iter().filter(|f| f.samples > 0) {
        root.samples += f.samples;
        let mut n = &mut root;
        for frame in f.stack.split(';').filter(|s| !s.is_empty()) {
            n = n.children.entry(frame.to_string()).or_default();
            n.samples += f.samples;
        }
    }
    if root.samples == 0 {
        return None;
    }
    let depth = root.depth();
    let top = 24.0;
    let height = top + depth as f64 * ROW + 4.0;
    let mut o = String::new();
    let _ = write!(
        o,
        "<svg class=\"chart flame\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} \
         {height}\" width=\"{WIDTH}\" height=\"{height}\" role=\"img\"><title>{}</title>\
         <text class=\"axis\" x=\"{}\" y=\"16\" text-anchor=\"middle\">{}</text>",
        esc(title),
        WIDTH / 2.0,
        esc(title)
    );
    let px = WIDTH / root.samples as f64;
    // The root ("all") on the bottom row; each child row above its parent.
    let bottom = height - 4.0 - ROW;
    draw(&mut o, "all", &root, 0.0, bottom, px, root.samples);
    o.push_str("</svg>");
    Some(o)
}

fn draw(o: &mut String, name: &str, n: &Node, x: f64, y: f64, px: f64, total: u64) {
    let w = n.samples as f64 * px;
    if w < MIN_PX {
        return;
    }
    let share = n.samples as f64 / total as f64 * 100.0;
    let _ = write!(
        o,
        "<g><title>{} ({} samples, {share:.1}%)</title><rect x=\"{x:.1}\" y=\"{y:.1}\" \
         width=\"{:.1}\" height=\"{:.1}\" rx=\"2\" fill=\"{}\"/>",
        esc(name),
        n.samples,
        (w - 0.5).max(0.1),
        ROW - 1.0,
        color(name)
    );
    let fits = ((w - 6.0) / CHAR_PX).floor();
    if fits >= 3.0 {
        let fits = fits as usize;
        let label = if name.chars().count() <= fits {
            name.to_string()
        } else {
            let mut s: String = name.chars().take(fits.saturating_sub(2)).collect();
            s.push_str("..");
            s
        };
        let _ = write!(
            o,
            "<text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x + 3.0,
            y + ROW - 4.5,
            esc(&label)
        );
    }
    o.push_str("</g>");
    let mut cx = x;
    for (child, c) in &n.children {
        draw(o, child, c, cx, y - ROW, px, total);
        cx += c.samples as f64 * px;
    }
}

/// The colour of a frame: the kernel's orange, code without a symbol grey, the rest warm
/// hues varied by name (a stable hash: the same function, the same colour).
fn color(name: &str) -> String {
    if name == "all" {
        return "#c8c8c8".into();
    }
    if name.ends_with("_[k]") {
        return "#e8a23c".into();
    }
    if !name.contains('`') {
        return "#b9b9b9".into();
    }
    let h = name.bytes().fold(2166136261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16777619)
    });
    let r = 205 + (h % 50);
    let g = 80 + ((h >> 8) % 120);
    let b = 40 + ((h >> 16) % 40);
    format!("rgb({r},{g},{b})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(stack: &str, samples: u64) -> FoldedStack {
        FoldedStack {
            stack: stack.into(),
            samples,
        }
    }

    #[test]
    fn boxes_are_as_wide_as_their_samples_with_callers_below() {
        let svg = flame_graph(
            &[
                f("nginx`main;nginx`ngx_ssl_handshake;libcrypto.so.3", 75),
                f("nginx`main;libc.so.6`writev;tcp_sendmsg_[k]", 25),
            ],
            "on-CPU",
        )
        .unwrap();
        // The root spans the width; the handshake three quarters of it, on the row above.
        assert!(svg.contains("all (100 samples, 100.0%)"), "{svg}");
        assert!(
            svg.contains("nginx`ngx_ssl_handshake (75 samples, 75.0%)"),
            "{svg}"
        );
        assert!(svg.contains("width=\"719.5\""), "{svg}");
        assert!(svg.contains("width=\"239.5\""), "{svg}");
        // Kernel frames orange, a library without a symbol grey.
        assert!(svg.contains("fill=\"#e8a23c\""), "{svg}");
        assert!(svg.contains("fill=\"#b9b9b9\""), "{svg}");
        // Four rows (all, main, the two callees, their leaves): 24 + 4 × 16 + 4.
        assert!(svg.contains("height=\"92\""), "{svg}");
        assert!(!svg.contains("<script"), "no scripts");
    }

    #[test]
    fn names_are_escaped_and_tiny_boxes_left_out() {
        let svg = flame_graph(
            &[
                f("app`std::vector<int>::push_back", 100_000),
                f("app`rare", 1),
            ],
            "t",
        )
        .unwrap();
        assert!(svg.contains("std::vector&lt;int&gt;::push_back"), "{svg}");
        assert!(!svg.contains("app`rare"), "a 0.01 px box is not drawn");
        assert_eq!(flame_graph(&[], "t"), None);
        assert_eq!(flame_graph(&[f("x", 0)], "t"), None);
    }
}

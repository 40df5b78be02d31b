//! The flow graph of one connection as a ladder: client and server lifelines, the handshake,
//! one arrow per packet with its time, flags and length; stalls banded and labelled.
//!
//! Every label has a place of its own, so none overlaps another, an arrow, a lifeline or a
//! stall band's edge however busy the flow: a row per packet (its label between the
//! lifelines and above its arrow, its time left of the client's), a caption per stall inside
//! its band, above the packet that ends the stall (its duration, then its cause wrapped to
//! the room between the lifelines), and labels cut to their slot's width (the whole text
//! stays in a `<title>` tooltip). Widths are estimated for the monospace font the labels use
//! (DejaVu Sans Mono's advance is 0.602 em; 0.62 leaves a margin).

use std::fmt::Write as _;

use lagtrace_model::diagnosis::evidence::{Direction, Flow, FlowPacket, Stall};

use crate::ms;
use crate::svg::esc;

const W: f64 = 760.0;
const CX: f64 = 190.0;
const SX: f64 = 590.0;
/// A packet's row: its label's baseline at the row's top, its arrow below the label.
const ROW: f64 = 32.0;
/// Where a packet's arrow starts and ends below its label's baseline (the label's box
/// reaches ~3 px below the baseline, an arrowhead ~5 px around the arrow's end: every
/// marker is drawn at the same size, whatever its arrow's stroke).
const ARROW_FROM: f64 = 7.0;
const ARROW_TO: f64 = 19.0;
/// A stall caption's line, and the gap between two captions ending at the same packet.
const CAPTION_LINE: f64 = 14.0;
const CAPTION_GAP: f64 = 6.0;
/// A caption's last baseline above its band's bottom edge.
const CAPTION_BOTTOM: f64 = 7.0;
/// A stall band's bottom edge above the label of the packet ending it (that label's box
/// starts ~10 px above its baseline), and its top edge below the label of the packet
/// starting it (its box ends ~3 px below the baseline).
const BAND_BOTTOM: f64 = 13.0;
const BAND_TOP: f64 = 5.0;
/// The room a caption's text may take: between the lifelines, clear of both.
const CAPTION_WIDTH: f64 = SX - CX - 28.0;
/// The cause's lines in a caption, at most (then cut, the whole in the tooltip).
const CAPTION_CAUSE_LINES: usize = 2;
/// The row that separates the handshake from the packets later on the connection.
const GAP_ROW: f64 = 34.0;
/// Where the first row starts (below the two-line host headers).
const TOP: f64 = 62.0;
/// Average advance of one character of the labels' monospace font, in em.
const EM_ADVANCE: f64 = 0.62;

/// How many characters of the labels' font at `font_px` fit in `width_px` (at least 2).
fn chars_in(width_px: f64, font_px: f64) -> usize {
    (width_px / (font_px * EM_ADVANCE)).floor().max(2.0) as usize
}

/// `s` cut to fit `width_px` at `font_px`, with an ellipsis when cut.
fn fit(s: &str, width_px: f64, font_px: f64) -> (String, bool) {
    let max = chars_in(width_px, font_px);
    if s.chars().count() <= max {
        return (s.to_string(), false);
    }
    let mut t: String = s.chars().take(max - 1).collect();
    t.push('…');
    (t, true)
}

/// One `<text>`: the fitted label, and the whole text as a tooltip when it was cut.
fn label(o: &mut String, attrs: &str, text: &str, width_px: f64, font_px: f64) {
    let (shown, cut) = fit(text, width_px, font_px);
    text_line(o, attrs, &shown, cut.then_some(text));
}

/// One `<text>` showing `shown`, with `whole` as its tooltip.
fn text_line(o: &mut String, attrs: &str, shown: &str, whole: Option<&str>) {
    let title = whole.map_or(String::new(), |w| format!("<title>{}</title>", esc(w)));
    let _ = write!(o, "<text {attrs}>{title}{}</text>", esc(shown));
}

/// `s` wrapped at whitespace into at most `lines` lines of `width_px` at `font_px` (a word
/// longer than a line is broken), the last cut with an ellipsis when the rest does not fit;
/// and whether anything was cut. Nothing for an empty `s`.
fn wrap(s: &str, width_px: f64, font_px: f64, lines: usize) -> (Vec<String>, bool) {
    let max = chars_in(width_px, font_px);
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut cur_n = 0;
    for word in s.split_whitespace() {
        let mut w = word;
        while !w.is_empty() {
            let wn = w.chars().count();
            let need = if cur_n == 0 { wn } else { cur_n + 1 + wn };
            if need <= max {
                if cur_n > 0 {
                    cur.push(' ');
                    cur_n += 1;
                }
                cur.push_str(w);
                cur_n += wn;
                break;
            }
            if cur_n > 0 {
                out.push(std::mem::take(&mut cur));
                cur_n = 0;
                continue;
            }
            // Alone longer than a line: its first `max` characters make one.
            let cut_at = w.char_indices().nth(max).map_or(w.len(), |(b, _)| b);
            out.push(w[..cut_at].to_string());
            w = &w[cut_at..];
        }
    }
    if cur_n > 0 {
        out.push(cur);
    }
    if out.len() <= lines {
        return (out, false);
    }
    let rest = out.split_off(lines.saturating_sub(1)).join(" ");
    let (mut last, _) = fit(&rest, width_px, font_px);
    if !last.ends_with('…') {
        last.pop();
        last.push('…');
    }
    out.push(last);
    (out, true)
}

/// A stall's caption lines, and whether its cause was cut.
type Caption = (Vec<String>, bool);

/// A stall's caption: its duration, then its cause wrapped between the lifelines.
fn caption(s: &Stall) -> Caption {
    let (mut lines, cut) = wrap(&s.label, CAPTION_WIDTH, 11.0, CAPTION_CAUSE_LINES);
    lines.insert(0, format!("{} stall", ms(s.gap_us)));
    (lines, cut)
}

/// The room the captions of the stalls ending at a packet take above its label: their
/// lines and gaps, and the clearance from the arrow of the packet before. `captions` are
/// the flow's stalls' in order.
fn caption_room(f: &Flow, captions: &[Caption], frame: u64) -> f64 {
    let ending: Vec<&Caption> = f
        .stalls
        .iter()
        .zip(captions)
        .filter(|(s, _)| s.to_frame == frame)
        .map(|(_, c)| c)
        .collect();
    if ending.is_empty() {
        return 0.0;
    }
    let lines: usize = ending.iter().map(|c| c.0.len()).sum();
    // The last line's baseline sits CAPTION_BOTTOM above the band's bottom edge; a line's box
    // reaches 11 px above its baseline (the duration's, 12 px bold); the arrow before ends
    // ARROW_TO below its row (+5 for its head) and 4 px more keep them apart.
    let block = CAPTION_LINE * (lines - 1) as f64
        + CAPTION_GAP * (ending.len() - 1) as f64
        + 11.0
        + BAND_BOTTOM
        + CAPTION_BOTTOM;
    (block + ARROW_TO + 5.0 + 4.0 - ROW).max(0.0)
}

/// Vertical positions: one per shown packet (handshake first), the handshake/packets gap
/// row; and the stalls' captions (in the flow's order), whose lines the rows make room for.
struct Layout<'a> {
    rows: Vec<(&'a FlowPacket, bool, f64)>,
    gap_y: Option<f64>,
    height: f64,
    captions: Vec<Caption>,
}

impl<'a> Layout<'a> {
    fn of(f: &'a Flow) -> Layout<'a> {
        let captions: Vec<Caption> = f.stalls.iter().map(caption).collect();
        let mut rows = Vec::with_capacity(f.handshake.len() + f.packets.len());
        let mut y = TOP;
        for p in &f.handshake {
            rows.push((p, true, y));
            y += ROW;
        }
        let mut gap_y = None;
        if !f.handshake.is_empty() && !f.packets.is_empty() {
            gap_y = Some(y + 4.0);
            y += GAP_ROW;
        }
        for p in &f.packets {
            y += caption_room(f, &captions, p.frame);
            rows.push((p, false, y));
            y += ROW;
        }
        Layout {
            rows,
            gap_y,
            height: y + 20.0,
            captions,
        }
    }

    /// The row of a frame among the packets after the handshake.
    fn y_of(&self, frame: u64) -> Option<f64> {
        self.rows
            .iter()
            .find(|(p, hs, _)| !hs && p.frame == frame)
            .map(|r| r.2)
    }
}

/// The flow graph of one connection as a ladder.
pub fn flow_ladder(f: &Flow) -> String {
    let lay = Layout::of(f);
    let h = lay.height;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg class="chart" id="flow-ladder" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" aria-label="flow graph of stream {}">"#,
        f.stream
    );
    let _ = write!(
        o,
        r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#444"/></marker><marker id="arrow-hot" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="4.2" markerHeight="4.2" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#c0392b"/></marker><marker id="arrow-hs" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#2471a3"/></marker></defs>"##
    );
    stalls(&mut o, f, &lay);
    lifelines(&mut o, f, h);
    if let Some(y) = lay.gap_y {
        let _ = write!(
            o,
            r#"<text x="{}" y="{:.1}" text-anchor="middle" class="gap">⋯ later on the same connection ⋯</text>"#,
            (CX + SX) / 2.0,
            y + 12.0
        );
    }
    let hot: Vec<u64> = f.stalls.iter().map(|s| s.to_frame).collect();
    for &(p, hs, y0) in &lay.rows {
        packet(&mut o, p, y0, hs, !hs && hot.contains(&p.frame));
    }
    o.push_str("</svg>");
    o
}

/// The stall bands, and their captions stacked in the room above the packet ending them.
fn stalls(o: &mut String, f: &Flow, lay: &Layout<'_>) {
    for (i, s) in f.stalls.iter().enumerate() {
        let (Some(ya), Some(yb)) = (lay.y_of(s.from_frame), lay.y_of(s.to_frame)) else {
            continue;
        };
        let (y0, y1) = (ya + BAND_TOP, yb - BAND_BOTTOM);
        let _ = write!(
            o,
            r##"<rect class="stall" x="{}" y="{y0:.1}" width="{}" height="{:.1}" fill="#fdecea" fill-opacity="0.75" stroke="#c0392b" stroke-dasharray="4 3"/>"##,
            CX - 10.0,
            SX - CX + 20.0,
            (y1 - y0).max(8.0)
        );
        // The captions of the stalls ending at this packet, stacked upwards from the
        // band's bottom edge in order: this one's lines below those of the stalls after it.
        let after: Vec<&Caption> = f.stalls[i + 1..]
            .iter()
            .zip(&lay.captions[i + 1..])
            .filter(|(t, _)| t.to_frame == s.to_frame)
            .map(|(_, c)| c)
            .collect();
        let below: usize = after.iter().map(|c| c.0.len()).sum();
        let (lines, cut) = &lay.captions[i];
        let whole = format!("{} stall: {}", ms(s.gap_us), s.label);
        let last =
            y1 - CAPTION_BOTTOM - CAPTION_LINE * below as f64 - CAPTION_GAP * after.len() as f64;
        let n = lines.len();
        for (k, line) in lines.iter().enumerate() {
            let y = last - CAPTION_LINE * (n - 1 - k) as f64;
            let class = if k == 0 { "stall-label" } else { "stall-cause" };
            text_line(
                o,
                &format!(
                    r#"x="{}" y="{y:.1}" text-anchor="middle" class="{class}""#,
                    (CX + SX) / 2.0
                ),
                line,
                cut.then_some(whole.as_str()),
            );
        }
    }
}

/// The two hosts (role above, address below) and their lifelines.
fn lifelines(o: &mut String, f: &Flow, h: f64) {
    for (x, role, addr) in [(CX, "client", &f.client), (SX, "server", &f.server)] {
        let room = 2.0 * (x.min(W - x) - 8.0);
        let _ = write!(
            o,
            r#"<text x="{x}" y="16" text-anchor="middle" class="host">{role}</text>"#
        );
        label(
            o,
            &format!(r#"x="{x}" y="32" text-anchor="middle" class="addr""#),
            addr,
            room,
            11.0,
        );
        let _ = write!(
            o,
            r##"<line class="lifeline" x1="{x}" x2="{x}" y1="40" y2="{}" stroke="#333" stroke-width="2"/>"##,
            h - 10.0
        );
    }
}

/// One packet's arrow, its label between the lifelines and its time and frame on the left.
fn packet(o: &mut String, p: &FlowPacket, y0: f64, handshake: bool, hot: bool) {
    let (x1, x2) = match p.dir {
        Direction::ToServer => (CX, SX),
        Direction::ToClient => (SX, CX),
    };
    let (class, stroke, marker, width) = if hot {
        ("pkt", "#c0392b", "arrow-hot", 2.5)
    } else if handshake {
        ("pkt handshake", "#2471a3", "arrow-hs", 1.5)
    } else {
        ("pkt", "#444", "arrow", 1.5)
    };
    let _ = write!(
        o,
        r#"<line class="{class}" x1="{x1}" y1="{:.1}" x2="{x2}" y2="{:.1}" stroke="{stroke}" stroke-width="{width}" marker-end="url(#{marker})"/>"#,
        y0 + ARROW_FROM,
        y0 + ARROW_TO
    );
    let text = match (p.note.is_empty(), handshake) {
        (true, true) => format!("{} (handshake)", p.flags),
        (true, false) => format!("{} len {}", p.flags, p.len),
        (false, _) => format!("{} len {} · {}", p.flags, p.len, p.note),
    };
    let cls = if hot { "pkt-label hot" } else { "pkt-label" };
    label(
        o,
        &format!(
            r#"x="{}" y="{y0:.1}" text-anchor="middle" class="{cls}""#,
            (CX + SX) / 2.0
        ),
        &text,
        SX - CX - 28.0,
        11.0,
    );
    label(
        o,
        &format!(
            r#"x="{}" y="{:.1}" text-anchor="end" class="time""#,
            CX - 16.0,
            y0 + (ARROW_FROM + ARROW_TO) / 2.0 + 4.0
        ),
        &format!("{:.6} s #{}", p.t_us as f64 / 1e6, p.frame),
        CX - 24.0,
        10.5,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_keeps_every_word_within_the_width_and_cuts_only_past_the_last_line() {
        // 10 px at 10 px font: 1 character is 6.2 px, 16 to a line of 100 px.
        let (l, cut) = wrap(
            "Nagle holds the segment until the delayed ACK",
            100.0,
            10.0,
            3,
        );
        assert!(!cut);
        assert_eq!(l, ["Nagle holds the", "segment until", "the delayed ACK"]);
        assert_eq!(l.join(" "), "Nagle holds the segment until the delayed ACK");
        let (l, cut) = wrap("  tabs\tand\nlines  ", 100.0, 10.0, 3);
        assert_eq!((l, cut), (vec!["tabs and lines".to_string()], false));
        assert_eq!(wrap("", 100.0, 10.0, 2), (Vec::<String>::new(), false));
        // A word longer than a line is broken, and the rest goes on.
        let (l, cut) = wrap("abcdefghijklmnopqrstuvwxyz end", 100.0, 10.0, 3);
        assert!(!cut);
        assert_eq!(l, ["abcdefghijklmnop", "qrstuvwxyz end"]);
        // Past the last line: cut there with an ellipsis, no line too wide.
        let (l, cut) = wrap(&"word ".repeat(20), 100.0, 10.0, 2);
        assert!(cut);
        assert_eq!(l.len(), 2);
        assert!(l[1].ends_with('…'));
        assert!(l.iter().all(|x| x.chars().count() <= 16), "{l:?}");
    }

    #[test]
    fn long_labels_are_cut_to_their_slot_with_an_ellipsis() {
        let (s, cut) = fit("short", 100.0, 10.0);
        assert_eq!((s.as_str(), cut), ("short", false));
        let long = "x".repeat(200);
        let (s, cut) = fit(&long, 100.0, 10.0);
        assert!(cut);
        assert!(s.ends_with('…'));
        assert!(s.chars().count() as f64 * 10.0 * EM_ADVANCE <= 100.0);
    }
}

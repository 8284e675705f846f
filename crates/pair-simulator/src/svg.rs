//! Hand-written SVG plots: TTFT CDF per policy, p95 TTFT against users per
//! policy, and each node's share of requests and of SLO misses.
//!
//! Plain strings instead of a plotting crate: the output is small, byte-stable
//! for a seed, opens in any browser, and costs no compile time.

use std::fmt::Write as _;

const W: f64 = 820.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 240.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;

/// A fixed colour per policy, so the same policy looks the same everywhere.
pub fn policy_colour(name: &str) -> &'static str {
    match name {
        "predicted-latency" => "#d62728",
        "pair" => "#1f77b4",
        "least-pending" => "#2ca02c",
        "p2c" => "#9467bd",
        "round-robin" => "#7f7f7f",
        _ => "#ff7f0e",
    }
}

const NODE_COLOURS: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#1b9e77", "#d95f02",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn header(out: &mut String, title: &str) {
    header_h(out, title, H);
}

fn header_h(out: &mut String, title: &str, h: f64) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{x:.1}\" y=\"22\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">{t}</text>\n",
        x = (LEFT + W - RIGHT) / 2.0,
        t = esc(title)
    );
}

/// A logarithmic axis over positive values, widened to whole decades.
#[derive(Clone, Copy, Debug)]
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    fn new(min: f64, max: f64) -> Self {
        let min = min.max(0.1);
        let max = max.max(min * 10.0);
        LogAxis {
            lo: min.log10().floor(),
            hi: max.log10().ceil(),
        }
    }
    fn frac(&self, v: f64) -> f64 {
        ((v.max(10f64.powf(self.lo)).log10() - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }
    /// 1-2-5 ticks per decade.
    fn ticks(&self) -> Vec<f64> {
        let mut t = Vec::new();
        let mut d = self.lo as i32;
        while d <= self.hi as i32 {
            for m in [1.0, 2.0, 5.0] {
                let v = m * 10f64.powi(d);
                if v.log10() <= self.hi + 1e-9 {
                    t.push(v);
                }
            }
            d += 1;
        }
        t
    }
}

fn fmt_ms(v: f64) -> String {
    if v >= 1_000.0 {
        let s = v / 1_000.0;
        if s.fract() == 0.0 {
            format!("{s:.0} s")
        } else {
            format!("{s:.1} s")
        }
    } else if v >= 1.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn plot_w() -> f64 {
    W - LEFT - RIGHT
}
fn plot_h() -> f64 {
    H - TOP - BOTTOM
}

fn frame(out: &mut String, x_label: &str, y_label: &str) {
    let _ = writeln!(
        out,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#333\"/>",
        plot_w(),
        plot_h()
    );
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        LEFT + plot_w() / 2.0,
        H - 12.0,
        esc(x_label)
    );
    let _ = writeln!(
        out,
        "<text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">{}</text>",
        TOP + plot_h() / 2.0,
        TOP + plot_h() / 2.0,
        esc(y_label)
    );
}

fn legend(out: &mut String, entries: &[(String, &str)]) {
    for (i, (name, colour)) in entries.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 20.0;
        let x = W - RIGHT + 15.0;
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" stroke-width=\"3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x + 22.0,
            x + 28.0,
            y + 4.0,
            esc(name)
        );
    }
}

fn x_log_grid(out: &mut String, axis: &LogAxis) {
    for t in axis.ticks() {
        let x = LEFT + axis.frac(t) * plot_w();
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
            TOP + plot_h(),
            TOP + plot_h() + 14.0,
            fmt_ms(t)
        );
    }
}

fn path(points: impl Iterator<Item = (f64, f64)>) -> String {
    let mut d = String::new();
    for (i, (x, y)) in points.enumerate() {
        let _ = write!(d, "{}{x:.1},{y:.1}", if i == 0 { "M" } else { " L" });
    }
    d
}

/// TTFT CDF per policy (log time axis), with the SLO as a dashed line.
pub fn ttft_cdf(title: &str, series: &[(String, Vec<(f64, f64)>)], slo_ms: f64) -> String {
    let mut out = String::new();
    header(&mut out, title);
    let min = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .filter(|v| *v > 0.0)
        .fold(f64::MAX, f64::min);
    let max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(slo_ms, f64::max);
    let axis = LogAxis::new(if min == f64::MAX { 1.0 } else { min }, max);
    x_log_grid(&mut out, &axis);
    for q in [0.25, 0.5, 0.75, 0.95] {
        let y = TOP + (1.0 - q) * plot_h();
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"10\">{:.0} %</text>",
            LEFT + plot_w(),
            LEFT - 6.0,
            y + 4.0,
            q * 100.0
        );
    }
    frame(
        &mut out,
        "time to first token (log scale)",
        "fraction of requests",
    );
    let sx = LEFT + axis.frac(slo_ms) * plot_w();
    let _ = writeln!(
        out,
        "<line x1=\"{sx:.1}\" y1=\"{TOP}\" x2=\"{sx:.1}\" y2=\"{:.1}\" stroke=\"#000\" stroke-dasharray=\"6 4\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">SLO {}</text>",
        TOP + plot_h(),
        sx + 4.0,
        TOP + 12.0,
        fmt_ms(slo_ms)
    );
    let mut entries = Vec::new();
    for (name, pts) in series {
        let colour = policy_colour(name);
        let d = path(
            pts.iter()
                .map(|(ms, f)| (LEFT + axis.frac(*ms) * plot_w(), TOP + (1.0 - f) * plot_h())),
        );
        let _ = writeln!(
            out,
            "<path d=\"{d}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>"
        );
        entries.push((name.clone(), colour));
    }
    legend(&mut out, &entries);
    out.push_str("</svg>\n");
    out
}

/// One policy's line on the users chart.
#[derive(Clone, Debug)]
pub struct UsersSeries {
    pub policy: String,
    /// (users, p95 TTFT ms), sorted by users.
    pub points: Vec<(u32, f64)>,
    pub users_at_slo: u32,
}

/// p95 TTFT (log axis) against closed-loop users, per policy, with the SLO
/// and each policy's users-at-SLO marked.
pub fn p95_vs_users(title: &str, series: &[UsersSeries], slo_ms: f64) -> String {
    let mut out = String::new();
    header(&mut out, title);
    let max_users = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(1);
    let (ymin, ymax) = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold((slo_ms, slo_ms), |(a, b), v| (a.min(v), b.max(v)));
    let axis = LogAxis::new(ymin, ymax);
    let x_of = |u: u32| LEFT + f64::from(u) / f64::from(max_users) * plot_w();
    let y_of = |ms: f64| TOP + (1.0 - axis.frac(ms)) * plot_h();
    for t in axis.ticks() {
        let y = y_of(t);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"10\">{}</text>",
            LEFT + plot_w(),
            LEFT - 6.0,
            y + 4.0,
            fmt_ms(t)
        );
    }
    let step = nice_step(f64::from(max_users) / 8.0);
    let mut u = 0.0;
    while u <= f64::from(max_users) + 1e-9 {
        let x = LEFT + u / f64::from(max_users) * plot_w();
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{u:.0}</text>",
            TOP + plot_h(),
            TOP + plot_h() + 14.0
        );
        u += step;
    }
    frame(
        &mut out,
        "closed-loop users",
        "p95 time to first token (log scale)",
    );
    let sy = y_of(slo_ms);
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{sy:.1}\" x2=\"{:.1}\" y2=\"{sy:.1}\" stroke=\"#000\" stroke-dasharray=\"6 4\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">SLO {}</text>",
        LEFT + plot_w(),
        LEFT + 4.0,
        sy - 4.0,
        fmt_ms(slo_ms)
    );
    let mut entries = Vec::new();
    for s in series {
        let colour = policy_colour(&s.policy);
        let d = path(s.points.iter().map(|(u, ms)| (x_of(*u), y_of(*ms))));
        let _ = writeln!(
            out,
            "<path d=\"{d}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>"
        );
        for (u, ms) in &s.points {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{colour}\"/>",
                x_of(*u),
                y_of(*ms)
            );
        }
        if s.users_at_slo > 0 {
            let x = x_of(s.users_at_slo);
            let _ = writeln!(
                out,
                "<line x1=\"{x:.1}\" y1=\"{sy:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{colour}\" stroke-width=\"1.5\" stroke-dasharray=\"2 3\"/>",
                TOP + plot_h()
            );
        }
        entries.push((format!("{} ({} users)", s.policy, s.users_at_slo), colour));
    }
    legend(&mut out, &entries);
    out.push_str("</svg>\n");
    out
}

fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1.0);
    let mag = 10f64.powf(raw.log10().floor());
    let m = raw / mag;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// One policy's per-node shares, for [`node_shares`].
#[derive(Clone, Debug)]
pub struct ShareRow {
    pub policy: String,
    /// Per node, in node order: (share of requests, share of SLO misses).
    pub shares: Vec<(f64, f64)>,
}

/// Two stacked bars per policy (requests, SLO misses), one colour per node:
/// a policy that feeds a slow node shows a wide slice of its colour in the
/// misses bar.
pub fn node_shares(title: &str, nodes: &[String], rows: &[ShareRow]) -> String {
    let mut out = String::new();
    let bar_h = 14.0;
    let gap = 10.0;
    let height = (TOP + 16.0 + rows.len() as f64 * (2.0 * (bar_h + 2.0) + gap))
        .max(TOP + 30.0 + nodes.len() as f64 * 20.0);
    header_h(&mut out, title, height);
    let label_w = 150.0;
    let x0 = LEFT + label_w - 60.0;
    let width = W - RIGHT - x0;
    let mut y = TOP + 6.0;
    for row in rows {
        for (k, label) in ["requests", "SLO misses"].iter().enumerate() {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"10\">{}{}</text>",
                x0 - 6.0,
                y + bar_h - 3.0,
                if k == 0 {
                    format!("{} · ", esc(&row.policy))
                } else {
                    String::new()
                },
                label
            );
            let mut x = x0;
            for (i, (req, miss)) in row.shares.iter().enumerate() {
                let share = if k == 0 { *req } else { *miss };
                let w = share * width;
                if w > 0.0 {
                    let _ = writeln!(
                        out,
                        "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{bar_h}\" fill=\"{}\"><title>{} {:.1} %</title></rect>",
                        NODE_COLOURS[i % NODE_COLOURS.len()],
                        esc(nodes.get(i).map_or("", String::as_str)),
                        share * 100.0
                    );
                }
                x += w;
            }
            if k == 1 && row.shares.iter().all(|s| s.1 == 0.0) {
                let _ = writeln!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"#555\">no misses</text>",
                    x0 + 4.0,
                    y + bar_h - 3.0
                );
            }
            y += bar_h + 2.0;
        }
        y += gap;
    }
    let entries: Vec<(String, &str)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), NODE_COLOURS[i % NODE_COLOURS.len()]))
        .collect();
    legend(&mut out, &entries);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_svg_has_a_path_per_policy_and_escapes_text() {
        let s = ttft_cdf(
            "a <b>",
            &[
                ("pair".into(), vec![(10.0, 0.5), (100.0, 1.0)]),
                ("predicted-latency".into(), vec![(5.0, 0.5), (50.0, 1.0)]),
            ],
            200.0,
        );
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<path").count(), 2);
        assert!(s.contains("a &lt;b&gt;"));
    }

    #[test]
    fn users_svg_marks_each_policy() {
        let s = p95_vs_users(
            "u",
            &[UsersSeries {
                policy: "pair".into(),
                points: vec![(1, 100.0), (2, 150.0), (4, 3_000.0)],
                users_at_slo: 2,
            }],
            2_000.0,
        );
        assert!(s.contains("pair (2 users)"));
        assert_eq!(s.matches("<circle").count(), 3);
    }

    #[test]
    fn log_axis_ticks_cover_the_range() {
        let a = LogAxis::new(3.0, 4_000.0);
        let t = a.ticks();
        assert_eq!(t.first().copied(), Some(1.0));
        assert!(t.iter().any(|v| (*v - 10_000.0).abs() < 1e-6));
        assert_eq!(a.frac(1.0), 0.0);
        assert_eq!(a.frac(10_000.0), 1.0);
    }
}

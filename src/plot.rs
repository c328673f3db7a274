//! The loss curve of a run as an SVG picture, drawn from its metrics log.

use crate::CliResult;
use std::fmt::Write as _;
use std::path::Path;

/// Draws the training and (where present) validation loss of a run's logged steps — `(step,
/// loss, val_loss)`, as the metrics log keeps them in memory — on a log-scale loss axis. The
/// metrics file itself is never read back: it may be a pipe (`--metrics /dev/stdout`).
pub fn write_loss_plot(curve: &[(u64, f32, Option<f32>)], svg_path: &Path) -> CliResult<()> {
    let ok = |l: f64| l > 0.0 && l.is_finite();
    let train: Vec<(f64, f64)> = curve
        .iter()
        .map(|&(s, l, _)| (s as f64, l as f64))
        .filter(|p| ok(p.1))
        .collect();
    let val: Vec<(f64, f64)> = curve
        .iter()
        .filter_map(|&(s, _, v)| v.map(|v| (s as f64, v as f64)))
        .filter(|p| ok(p.1))
        .collect();
    std::fs::write(svg_path, render(&train, &val)).map_err(|e| {
        format!(
            "cannot write {}",
            duet_engine::dataset::at_path(svg_path, &e)
        )
    })?;
    Ok(())
}

/// An SVG with the training loss (blue) and validation loss (orange) against the step.
pub fn render(train: &[(f64, f64)], val: &[(f64, f64)]) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 420.0, 70.0, 20.0, 30.0, 50.0);
    let all = train.iter().chain(val);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y.ln());
        y1 = y1.max(y.ln());
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-9 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let px = |x: f64| ml + (x - x0) / (x1 - x0) * (w - ml - mr);
    let py = |ly: f64| mt + (y1 - ly) / (y1 - y0) * (h - mt - mb);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    let _ = write!(
        s,
        r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#,
        h - mb,
        w - mr,
        h - mb,
        h - mb
    );
    for v in log_ticks(y0.exp(), y1.exp()) {
        let y = py(v.ln());
        let _ = write!(
            s,
            r##"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            w - mr,
            ml - 6.0,
            y + 4.0,
            tick_label(v)
        );
    }
    for xv in linear_ticks(x0, x1, 6) {
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="black"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            h - mb,
            h - mb + 4.0,
            h - mb + 18.0,
            tick_label(xv),
            x = px(xv),
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">step</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">loss (log scale)</text>"#,
        (ml + w - mr) / 2.0,
        h - 10.0,
        h / 2.0,
        h / 2.0
    );
    for (pts, color, label, ly) in [
        (train, "#1f77b4", "train", 16.0),
        (val, "#ff7f0e", "validation", 32.0),
    ] {
        if pts.is_empty() {
            continue;
        }
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y.ln())))
            .collect();
        // The legend: a swatch of the line and its name, top right.
        let lx = w - mr - 110.0;
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/><line x1="{lx}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-width="2"/><text x="{}" y="{ly}">{label}</text>"#,
            path.join(" "),
            ly - 4.0,
            lx + 20.0,
            ly - 4.0,
            lx + 26.0,
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Round values for a log-scale axis over `[lo, hi]`: 1, 2 and 5 × 10^k inside it, every
/// integer multiple of 10^k where those are fewer than three, and round linear steps where the
/// range is too narrow for either.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
        return vec![];
    }
    let inside = |mults: &[f64]| -> Vec<f64> {
        let (k0, k1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        let mut v: Vec<f64> = (k0..=k1)
            .flat_map(|k| mults.iter().map(move |m| m * 10f64.powi(k)))
            .filter(|&v| v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9))
            .collect();
        v.dedup();
        v
    };
    let coarse = inside(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 3 {
        return coarse;
    }
    let fine = inside(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    if fine.len() >= 3 {
        return fine;
    }
    linear_ticks(lo, hi, 5)
}

/// Round values (1, 2 or 5 × 10^k apart) inside `[lo, hi]`, at most about `max` of them.
fn linear_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    if !(hi > lo && lo.is_finite() && hi.is_finite()) {
        return if lo.is_finite() { vec![lo] } else { vec![] };
    }
    let raw = (hi - lo) / max.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&st| st >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// A tick's text: as few digits as its value needs (`0.05`, `2`, `300`, `2.5`).
fn tick_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (4 - v.abs().log10().floor() as i32).clamp(0, 8) as usize;
    let t = format!("{v:.digits$}");
    if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::{linear_ticks, log_ticks, tick_label};

    /// Issue 50 item 11: the axes tick at round values (1, 2, 5 × 10^k; the loss axis finer
    /// where the range is narrow), labelled with the digits they need.
    #[test]
    fn ticks_are_round_values() {
        let labels = |v: Vec<f64>| v.into_iter().map(tick_label).collect::<Vec<_>>().join(" ");
        assert_eq!(labels(log_ticks(1.5, 11.0)), "2 5 10");
        assert_eq!(labels(log_ticks(1.5, 9.0)), "2 3 4 5 6 7 8 9");
        assert_eq!(labels(log_ticks(0.08, 30.0)), "0.1 0.2 0.5 1 2 5 10 20");
        assert_eq!(labels(log_ticks(2.1, 4.5)), "2.5 3 3.5 4 4.5");
        assert_eq!(labels(log_ticks(3.1, 3.35)), "3.1 3.15 3.2 3.25 3.3 3.35");
        assert_eq!(labels(linear_ticks(1.0, 400.0, 6)), "100 200 300 400");
        assert_eq!(labels(linear_ticks(0.0, 12.0, 6)), "0 2 4 6 8 10 12");
        let one: Vec<String> = [0.05, 2.0, 300.0, 2.5, 3.15, 0.1 + 0.2]
            .iter()
            .map(|&v| tick_label(v))
            .collect();
        assert_eq!(one, ["0.05", "2", "300", "2.5", "3.15", "0.3"]);
    }

    #[test]
    fn renders_both_curves() {
        let svg = super::render(&[(1.0, 4.0), (2.0, 2.0), (3.0, 1.0)], &[(3.0, 1.5)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        let empty = super::render(&[], &[]);
        assert!(!empty.contains("NaN"));
    }
}

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
    std::fs::write(svg_path, render(&train, &val))
        .map_err(|e| format!("cannot write {}: {e}", svg_path.display()))?;
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
    for i in 0..=4 {
        let ly = y0 + (y1 - y0) * i as f64 / 4.0;
        let y = py(ly);
        let _ = write!(
            s,
            r##"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.3}</text>"##,
            w - mr,
            ml - 6.0,
            y + 4.0,
            ly.exp()
        );
        let xv = x0 + (x1 - x0) * i as f64 / 4.0;
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{:.0}</text>"#,
            px(xv),
            h - mb + 18.0,
            xv
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
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/><text x="{}" y="{ly}" fill="{color}">{label}</text>"#,
            path.join(" "),
            w - mr - 90.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_both_curves() {
        let svg = super::render(&[(1.0, 4.0), (2.0, 2.0), (3.0, 1.0)], &[(3.0, 1.5)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        let empty = super::render(&[], &[]);
        assert!(!empty.contains("NaN"));
    }
}

//! The delivery-rate chart: an inline SVG of bars (no script, no external
//! file; colours come from the stylesheet through class names).

use std::fmt::Write as _;

use super::html::rate_text;

/// An SVG bar chart of `rates` (deliveries per second, oldest first),
/// `width` × `height` pixels, scaled to its highest bar.
pub(crate) fn bars(rates: &[f64], width: u32, height: u32) -> String {
    let peak = rates.iter().copied().fold(0.0_f64, f64::max);
    let label = if rates.is_empty() {
        "no deliveries measured yet".to_owned()
    } else {
        format!("deliveries per second, peak {}", rate_text(peak))
    };
    let mut svg = format!(
        r#"<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{label}"><title>{label}</title><line class="axis" x1="0" y1="{y}" x2="{width}" y2="{y}"/>"#,
        y = height.saturating_sub(1)
    );
    if !rates.is_empty() {
        let slot = f64::from(width) / rates.len() as f64;
        let gap = if slot >= 4.0 { 1.0 } else { 0.0 };
        let room = f64::from(height.saturating_sub(2));
        for (i, r) in rates.iter().enumerate() {
            let h = if peak > 0.0 {
                (r / peak * room).max(if *r > 0.0 { 1.0 } else { 0.0 })
            } else {
                0.0
            };
            let _ = write!(
                svg,
                r#"<rect class="bar" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/>"#,
                i as f64 * slot,
                f64::from(height) - 1.0 - h,
                (slot - gap).max(0.5),
                h
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_peak_and_an_empty_chart_says_so() {
        let svg = bars(&[0.0, 2.0, 4.0], 30, 22);
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains(r#"height="20.0""#), "{svg}");
        assert!(svg.contains(r#"height="10.0""#), "{svg}");
        assert!(svg.contains("peak 4.0/s"), "{svg}");
        let empty = bars(&[], 30, 21);
        assert!(!empty.contains("<rect") && empty.contains("no deliveries measured yet"));
    }
}

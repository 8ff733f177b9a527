//! `bench --plot out.png`: tokens/s against KV depth and against the VRAM budget, both engines,
//! one row of two panels per test size (pp512, pp4096, tg128, ...). PocketMoE is drawn solid with
//! circles, llama.cpp (its best setting that fits) dashed with triangles; colour tells the budget
//! (depth panels) or the depth (budget panels). The resident runs sit at the model's file size on
//! the budget axis (about what holding all of it takes).
//!
//! plotters' bitmap backend with ab_glyph and DejaVu Sans from the `dejavu` crate: no system font
//! or fontconfig is needed, so the plot is the same on CI and on the GPU machine.
use super::report::{budget_name, Report, Row};
use anyhow::{anyhow, Result};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

const GIB: f64 = (1u64 << 30) as f64;

fn pe(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

fn register_font() {
    static FONT: Once = Once::new();
    FONT.call_once(|| {
        // The embedded font is a valid TrueType file; a failure would only lose the labels.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// One line of a panel.
struct Line {
    label: String,
    colour: RGBColor,
    ours: bool,
    points: Vec<(f64, f64)>,
}

fn unique<T: PartialEq + Copy>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

/// Both engines' lines for the rows in `rows`, grouped by `group`, with x from `x`.
fn lines(
    rows: &[&Row],
    group: &dyn Fn(&Row) -> (String, u64),
    x: &dyn Fn(&Row) -> f64,
) -> Vec<Line> {
    let groups = unique(rows.iter().map(|r| group(r).1));
    let mut out = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let mine: Vec<&&Row> = rows.iter().filter(|r| group(r).1 == *g).collect();
        let name = mine.first().map(|r| group(r).0).unwrap_or_default();
        for ours in [true, false] {
            let mut points: Vec<(f64, f64)> = mine
                .iter()
                .filter_map(|r| {
                    let y = if ours { r.ours_tok_s } else { r.llama_tok_s };
                    y.map(|y| (x(r), y))
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            if !points.is_empty() {
                let engine = if ours { "pocketmoe" } else { "llama.cpp" };
                out.push(Line {
                    label: format!("{engine} {name}"),
                    colour: colour(i),
                    ours,
                    points,
                });
            }
        }
    }
    out
}

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    title: &str,
    (x_desc, x_decimals): (&str, usize),
    lines: &[Line],
) -> Result<()> {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (mut x0, mut x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    let pad = ((x1 - x0) * 0.08).max(0.5);
    let y1 = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.7;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((x0 - pad).max(0.0)..(x1 + pad), 0.0..y1)
        .map_err(pe)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("tokens/s")
        .x_label_formatter(&|v| format!("{v:.x_decimals$}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(pe)?;
    for l in lines {
        let style = ShapeStyle::from(&l.colour).stroke_width(if l.ours { 3 } else { 2 });
        let pts = l.points.clone();
        let drawn = if l.ours {
            chart.draw_series(LineSeries::new(pts.clone(), style))
        } else {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
        }
        .map_err(pe)?;
        let ours = l.ours;
        drawn.label(l.label.clone()).legend(move |(x, y)| {
            let pts = vec![(x, y), (x + 22, y)];
            let size = if ours { 22 } else { 6 };
            DashedPathElement::new(pts, size, 4, style)
        });
        if l.ours {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, style.filled())))
                .map_err(pe)?;
        } else {
            chart
                .draw_series(
                    pts.iter()
                        .map(|&p| TriangleMarker::new(p, 6, style.filled())),
                )
                .map_err(pe)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(pe)?;
    Ok(())
}

/// Draws the report's rows to `path` (PNG).
pub fn plot(r: &Report, path: &Path) -> Result<()> {
    register_font();
    let kinds = unique(r.rows.iter().map(|w| (w.n_prompt, w.n_gen)));
    let resident_x = r.file_bytes as f64 / GIB;
    let height = 360 * kinds.len().max(1) as u32 + 50;
    let root = BitMapBackend::new(path, (1400, height)).into_drawing_area();
    root.fill(&WHITE).map_err(pe)?;
    let root = root
        .titled(
            &format!("pocketmoe vs llama.cpp: {} on {}", r.model, r.device),
            ("sans-serif", 22),
        )
        .map_err(pe)?;
    let panels = root.split_evenly((kinds.len().max(1), 2));
    for (k, &(p, n)) in kinds.iter().enumerate() {
        let rows: Vec<&Row> = r
            .rows
            .iter()
            .filter(|w| (w.n_prompt, w.n_gen) == (p, n))
            .collect();
        let test = if p > 0 {
            format!("pp{p}")
        } else {
            format!("tg{n}")
        };
        let by_budget = lines(
            &rows,
            &|w| {
                let b = w.budget.unwrap_or(u64::MAX);
                (budget_name(w.budget), b)
            },
            &|w| w.depth as f64,
        );
        panel(
            &panels[2 * k],
            &format!("{test}: tokens/s vs depth"),
            ("KV depth (tokens)", 0),
            &by_budget,
        )?;
        let by_depth = lines(
            &rows,
            &|w| (format!("d{}", w.depth), w.depth as u64),
            &|w| w.budget.map_or(resident_x, |b| b as f64 / GIB),
        );
        panel(
            &panels[2 * k + 1],
            &format!("{test}: tokens/s vs VRAM budget"),
            ("VRAM budget (GiB; resident at the file size)", 1),
            &by_depth,
        )?;
    }
    root.present().map_err(pe)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::placement::Bandwidths;

    fn row(budget: Option<u64>, p: usize, n: usize, depth: usize, ours: f64, llama: f64) -> Row {
        Row {
            budget,
            test: String::new(),
            n_prompt: p,
            n_gen: n,
            depth,
            ours_tok_s: Some(ours),
            ours_std: Some(1.0),
            llama_tok_s: Some(llama),
            llama_std: Some(1.0),
            llama_setting: None,
            ratio: Some(ours / llama),
            inproc_tok_s: Some(llama),
            stock_tok_s: None,
            ours_vram_bytes: None,
            ours_fits: None,
            llama_vram_bytes: None,
            ours_rss_bytes: None,
            llama_rss_bytes: None,
            hit_rate: None,
            cache_hit_rate: None,
            pcie_gbs: None,
            stall_ms_per_token: None,
            bound_tok_s: None,
            bound_fraction: None,
        }
    }

    /// Several budgets and depths (what the GPU matrix gives) draw to a PNG of the promised size.
    #[test]
    fn budgets_and_depths() {
        let mut rows = Vec::new();
        for (b, f) in [
            (None, 1.0),
            (Some(12u64 << 30), 0.5),
            (Some(8u64 << 30), 0.3),
        ] {
            for d in [0, 8192] {
                let slow = if d > 0 { 0.8 } else { 1.0 };
                rows.push(row(b, 512, 0, d, 7000.0 * f * slow, 7500.0 * f * slow));
                rows.push(row(b, 0, 128, d, 190.0 * f * slow, 270.0 * f * slow));
            }
        }
        let r = Report {
            model: "q3.gguf".into(),
            file_bytes: 17 << 30,
            device: "CUDA0".into(),
            device_memory: Some(140 << 30),
            threads: 16,
            cpu_variant: "haswell".into(),
            reps: 3,
            bandwidths: Bandwidths::default(),
            cpu_bw_measured: false,
            settings: Vec::new(),
            rows,
        };
        let path = std::env::temp_dir().join(format!("pmoe-plot-{}.png", std::process::id()));
        plot(&r, &path).unwrap();
        let b = std::fs::read(&path).unwrap();
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
        let be = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!((be(16), be(20)), (1400, 2 * 360 + 50));
        if std::env::var_os("POCKETMOE_KEEP_PLOT").is_none() {
            let _ = std::fs::remove_file(&path);
        }
    }
}

//! `bench --plot out.png`: tokens/s against KV depth and against the VRAM budget, both engines,
//! one row of two panels per test size (pp512, pp4096, tg128, ...). PocketMoE is drawn solid with
//! circles, llama.cpp (its best setting that fits) dashed with triangles; colour tells the budget
//! (depth panels) or the depth (budget panels). The resident runs sit at the device's memory on
//! the budget axis (the file size on the CPU).
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
        * 1.25;
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
    let resident_x = r.device_memory.unwrap_or(r.file_bytes) as f64 / GIB;
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
            ("VRAM budget (GiB; resident = whole device)", 1),
            &by_depth,
        )?;
    }
    root.present().map_err(pe)?;
    Ok(())
}

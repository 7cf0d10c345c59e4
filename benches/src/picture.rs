//! The SVG pictures `make rollout-picture` and `make drain-picture` draw from their runs'
//! figures (plotters; SVG text needs no fonts): a title line over one panel per setup, each panel
//! a chart with the run's moments marked by labelled vertical lines and a legend.

use std::ops::Range;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

/// One panel's drawing area.
pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
/// One panel's chart: seconds across, the panel's measure up.
pub type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A drawing error as text.
pub fn failed(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// An SVG at `out`, `width` wide: `title` on top, then `panels` panels of `panel_height` each,
/// one above the other. Returns the whole picture (to `present`) and the panels.
pub fn panels<'a>(
    out: &'a str,
    width: u32,
    panel_height: u32,
    title: &str,
    panels: usize,
) -> Result<(Area<'a>, Vec<Area<'a>>), String> {
    let root = SVGBackend::new(out, (width, panel_height * panels as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let (top, body) = root.split_vertically(40);
    top.draw_text(title, &("sans-serif", 18).into_text_style(&top), (10, 12))
        .map_err(failed)?;
    let areas = body.split_evenly((panels, 1));
    Ok((root, areas))
}

/// A panel's chart with its caption and axes (`x_desc` across, `y_desc` up), no vertical grid;
/// `y_whole`: the y labels are whole numbers (else plotters' own).
pub fn chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    x: Range<f64>,
    y: Range<f64>,
    (x_desc, y_desc): (&str, &str),
    y_whole: bool,
) -> Result<Chart<'a, 'b>, String> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(x, y)
        .map_err(failed)?;
    let whole = |v: &f64| format!("{v:.0}");
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0));
    if y_whole {
        mesh.y_label_formatter(&whole);
    }
    mesh.draw().map_err(failed)?;
    Ok(chart)
}

/// A labelled vertical line at each moment `(name, x)` in `colour`, the label at the top.
pub fn marks(
    chart: &mut Chart<'_, '_>,
    marks: &[(String, f64)],
    colour: RGBAColor,
) -> Result<(), String> {
    let y = chart.y_range();
    for (name, x) in marks {
        chart
            .draw_series(LineSeries::new(vec![(*x, y.start), (*x, y.end)], colour))
            .map_err(failed)?;
        chart
            .draw_series(std::iter::once(Text::new(
                name.clone(),
                (*x + 0.05, y.end - (y.end - y.start) * 0.03),
                ("sans-serif", 11).into_font(),
            )))
            .map_err(failed)?;
    }
    Ok(())
}

/// A legend entry's sample: a short line in `colour`.
pub fn legend_line(colour: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
}

/// The legend of the labelled series, at `position`.
pub fn legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(failed)
}

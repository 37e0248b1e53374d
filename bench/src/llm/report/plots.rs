//! The report's plots (SVG): each metric against load per contender, and latency CDFs at the knee.

use super::*;

pub(super) fn plots(
    s: &ShapeResult,
    names: &[String],
    loads: &[f64],
    g: &ByPoint<'_>,
    out: &Path,
    md: &mut String,
) -> Result<()> {
    let shape = s.shape.name();
    let swept: Vec<&String> = names
        .iter()
        .filter(|n| {
            loads
                .iter()
                .filter(|l| g.contains_key(&((*n).clone(), load_key(**l))))
                .count()
                > 1
        })
        .collect();
    for (metric, file, title, log) in [
        ("ttft_p99_s", "p99-ttft", "p99 TTFT (s) against load", true),
        (
            "goodput_rps",
            "goodput",
            "goodput (requests/s within the SLO) against load",
            false,
        ),
    ] {
        let curves: Vec<(String, Vec<(f64, f64)>)> = swept
            .iter()
            .map(|n| {
                let pts = loads
                    .iter()
                    .filter_map(|l| {
                        let runs = g.get(&((*n).clone(), load_key(*l)))?;
                        Some((l * s.knee, stat(runs, metric)?.0))
                    })
                    .collect();
                ((*n).clone(), pts)
            })
            .collect();
        let path = out.join(format!("{shape}-{file}.svg"));
        // A plot against load needs a contender run at two loads or more.
        if line_plot(
            &path,
            &format!("{shape}: {title}"),
            "offered load (requests/s)",
            &curves,
            log,
        )? {
            let _ = writeln!(md, "\n![{shape} {title}]({shape}-{file}.svg)");
        }
    }
    let curves: Vec<(String, Vec<(f64, f64)>)> = names
        .iter()
        .filter_map(|n| {
            let runs = g.get(&(n.clone(), load_key(1.0)))?;
            let mut t: Vec<f64> = runs.iter().flat_map(|r| r.ttfts.iter().copied()).collect();
            t.sort_by(f64::total_cmp);
            let k = t.len().max(1) as f64;
            Some((
                n.clone(),
                t.iter()
                    .enumerate()
                    .map(|(i, x)| (x.max(1e-3), (i + 1) as f64 / k))
                    .collect(),
            ))
        })
        .collect();
    if !curves.is_empty() {
        let path = out.join(format!("{shape}-cdf-knee.svg"));
        cdf_plot(&path, &format!("{shape}: TTFT CDF at the knee"), &curves)?;
        let _ = writeln!(
            md,
            "\n![{shape} TTFT CDF at the knee]({shape}-cdf-knee.svg)"
        );
    }
    Ok(())
}

pub(super) const COLORS: [plotters::style::RGBColor; 10] = [
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(140, 86, 75),
    plotters::style::RGBColor(227, 119, 194),
    plotters::style::RGBColor(127, 127, 127),
    plotters::style::RGBColor(188, 189, 34),
    plotters::style::RGBColor(23, 190, 207),
];

pub(super) fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Draws `curves` against load into `path`; false (nothing drawn) when they have no point.
pub(super) fn line_plot(
    path: &Path,
    title: &str,
    x_desc: &str,
    curves: &[(String, Vec<(f64, f64)>)],
    log_y: bool,
) -> Result<bool> {
    use plotters::prelude::*;
    let xs = curves.iter().flat_map(|(_, p)| p.iter().map(|x| x.0));
    let ys: Vec<f64> = curves
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .filter(|y| y.is_finite())
        .collect();
    let (x0, x1) = xs.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    if !x0.is_finite() || ys.is_empty() {
        return Ok(false);
    }
    let (x0, x1) = (x0 * 0.9, x1 * 1.05);
    let y1 = ys.iter().copied().fold(0.0, f64::max) * 1.3;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root);
    chart
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60);
    // The same series on either y axis.
    macro_rules! series {
        ($c:expr) => {{
            let c = &mut $c;
            c.configure_mesh().x_desc(x_desc).draw().map_err(err)?;
            for (i, (name, pts)) in curves.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(err)?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                c.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(err)?;
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(err)?;
        }};
    }
    if log_y {
        let y0 = ys.iter().copied().filter(|y| *y > 0.0).fold(y1, f64::min) * 0.7;
        let mut c = chart
            .build_cartesian_2d(x0..x1, (y0.max(1e-3)..y1.max(1e-2)).log_scale())
            .map_err(err)?;
        series!(c);
    } else {
        let mut c = chart
            .build_cartesian_2d(x0..x1, 0.0..y1.max(1e-2))
            .map_err(err)?;
        series!(c);
    }
    root.present().map_err(err)?;
    Ok(true)
}

pub(super) fn cdf_plot(
    path: &Path,
    title: &str,
    curves: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    use plotters::prelude::*;
    let max = curves
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(0.1f64, f64::max)
        * 1.2;
    let min = curves
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(max, f64::min)
        .max(0.005)
        * 0.8;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((min..max).log_scale(), 0.0f64..1.0f64)
        .map_err(err)?;
    c.configure_mesh()
        .x_desc("TTFT (s, log scale)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

//! The SVG chart of records/s per system and scenario (plotters).

use super::*;

pub(crate) fn write_svg(
    all: &[ScenarioResult],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 820)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    let mode = all.first().map_or("", |r| r.mode.as_str());
    title.draw(&Text::new(
        format!("rill vs Kafka Streams vs Parallel Consumer, local broker, 2 cores ({mode} run; higher is better except S4)"),
        (20, 12),
        ("sans-serif", 18).into_font(),
    ))?;
    let panels = body.split_evenly((2, 2));
    let colour = |name: &str| -> RGBColor {
        if name.starts_with("rill") {
            RGBColor(0x1f, 0x77, 0xb4)
        } else if name.starts_with("Kafka Streams") {
            RGBColor(0xd6, 0x27, 0x28)
        } else if name.starts_with("Parallel") {
            RGBColor(0x2c, 0xa0, 0x2c)
        } else {
            RGBColor(0x7f, 0x7f, 0x7f)
        }
    };
    for (panel, r) in panels.iter().zip(all) {
        let lat = r.scenario.starts_with("s4");
        let bars: Vec<(String, f64)> = r
            .systems
            .iter()
            .map(|s| {
                let v = s.median.as_ref().map_or(0.0, |m| {
                    if lat {
                        m.p99_ms.unwrap_or(0.0)
                    } else {
                        m.records_per_s
                    }
                });
                (s.system.clone(), v)
            })
            .collect();
        let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1.0);
        let n = bars.len() as i32;
        let caption = if lat {
            format!(
                "{}: p99 latency, ms (lower is better)",
                r.scenario.to_uppercase()
            )
        } else {
            format!("{}: records/s", r.title.split(':').next().unwrap_or(""))
        };
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..max * 1.18)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .x_labels(bars.len())
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .y_label_formatter(&|v| fmt_num(*v))
            .label_style(("sans-serif", 12))
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (name, v))| {
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), 0.0),
                    (SegmentValue::Exact(i as i32 + 1), *v),
                ],
                colour(name).filled(),
            );
            bar.set_margin(0, 0, 14, 14);
            bar
        }))?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let label = if *v == 0.0 {
                "no result".to_string()
            } else {
                fmt_num(*v)
            };
            Text::new(
                label,
                (SegmentValue::CenterOf(i as i32), *v + max * 0.07),
                ("sans-serif", 12).into_font(),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

//! DOT text laid out and drawn as SVG in this process (layout-rs), so a
//! picture of the tree needs no Graphviz on the node or the laptop. Linked
//! only by `nodefabric-full`: the hook binary stays lean.

/// Why a graph could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum SvgError {
    /// The DOT text did not parse (a bug in [`super::graph`]).
    #[error("the DOT graph does not parse: {0}")]
    Parse(String),
    /// The layout engine gave up on this graph.
    #[error("laying out the graph failed: {0}")]
    Layout(String),
}

/// The SVG document of `dot`.
pub fn render(dot: &str) -> Result<String, SvgError> {
    use layout::backends::svg::SVGWriter;
    use layout::gv::{DotParser, GraphBuilder};
    let graph = DotParser::new(dot).process().map_err(SvgError::Parse)?;
    // The engine asserts on shapes it cannot place: a failed picture is an
    // error for this command, never a crash of the process.
    std::panic::catch_unwind(|| {
        let mut builder = GraphBuilder::new();
        builder.visit_graph(&graph);
        let mut visual = builder.get();
        let mut svg = SVGWriter::new();
        visual.do_it(false, false, false, &mut svg);
        tidy(&svg.finalize())
    })
    .map_err(|p| {
        SvgError::Layout(
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic in layout-rs".into()),
        )
    })
}

/// The same picture as the same bytes: layout-rs keeps its font classes in a
/// HashMap and sums some coordinates in a HashSet's order, so two runs
/// differ in the order of the `<style>` lines and in the last digits of
/// floats. Coordinates are rounded to hundredths of a pixel (far below what
/// a screen shows) and the style lines sorted.
fn tidy(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    let mut style: Option<Vec<&str>> = None;
    // Tags span lines in layout-rs's output; text between tags (a NIC's
    // name, `eth0.100`) is never touched.
    let mut in_tag = false;
    for line in svg.split_inclusive('\n') {
        if let Some(lines) = style.as_mut() {
            if line.starts_with("</style>") {
                lines.sort_unstable();
                out.extend(lines.drain(..));
                style = None;
                out.push_str(line);
            } else {
                lines.push(line);
            }
            continue;
        }
        if line.trim_end().ends_with("<style>") {
            style = Some(Vec::new());
        }
        out.push_str(&round_floats(line, &mut in_tag));
    }
    out
}

/// Every decimal number inside a tag with more than two fractional digits,
/// rounded to two; `in_tag` carries whether the line starts inside a tag.
fn round_floats(line: &str, in_tag: &mut bool) -> String {
    let b = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() || !*in_tag {
            match b[i] {
                b'<' => *in_tag = true,
                b'>' => *in_tag = false,
                _ => {}
            }
            let len = line[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&line[i..i + len]);
            i += len;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let text = &line[start..i];
            let fraction = text.len() - text.find('.').unwrap_or(0) - 1;
            match text.parse::<f64>() {
                Ok(v) if fraction > 2 => out.push_str(&format!("{v:.2}")),
                _ => out.push_str(text),
            }
        } else {
            out.push_str(&line[start..i]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_noise_and_style_order_do_not_change_the_bytes() {
        let a = "</defs><style>\n.a14 { x }\n.a10 { y }\n</style>\n<path d=\"M 1.5 292.56738496050184 C 10 2\" id=\"arrow3\"/>\n";
        let b = "</defs><style>\n.a10 { y }\n.a14 { x }\n</style>\n<path d=\"M 1.5 292.5673849605018 C 10 2\" id=\"arrow3\"/>\n";
        assert_eq!(tidy(a), tidy(b));
        assert!(tidy(a).contains("M 1.5 292.57 C 10 2"), "{}", tidy(a));
        let text = "<text\nx=\"3.14159\"><tspan>eth0.100</tspan></text>\n";
        assert_eq!(
            tidy(text),
            "<text\nx=\"3.14\"><tspan>eth0.100</tspan></text>\n"
        );
    }
}

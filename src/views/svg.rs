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
        svg.finalize()
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

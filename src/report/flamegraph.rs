//! Report stage: flame-graph SVGs drawn by inferno from the collapsed stacks, and a small
//! SVG saying so when a graph has nothing to draw (inferno refuses empty input).

use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self, Options};

use super::folded::Measure;

/// The narrowest frame drawn, in percent of the graph's width: 1.2 pixels of the default
/// 1,200. inferno's own minimum (0.01%) draws slivers a tenth of a pixel wide that no one
/// can see or point at, and drawing each costs microseconds (three formatted floats): a
/// profile of many small stacks spent most of its report's time on them. Every stack,
/// however small, is still in the `.folded` files and report.json.
pub const MIN_WIDTH_PERCENT: f64 = 0.1;

/// The SVG of `folded` (collapsed lines) for `measure`; `subtitle` says what was run.
pub fn svg(folded: &str, measure: Measure, subtitle: &str) -> std::io::Result<Vec<u8>> {
    if folded.trim().is_empty() {
        return Ok(empty_svg(measure.title(), subtitle, measure.empty_message()).into_bytes());
    }
    let mut options = Options::default();
    options.title = measure.title().to_owned();
    options.subtitle = Some(subtitle.to_owned());
    options.count_name = "bytes".to_owned();
    options.name_type = "Frame:".to_owned();
    options.colors = Palette::Basic(BasicPalette::Mem);
    options.hash = true;
    options.deterministic = true;
    options.min_width = MIN_WIDTH_PERCENT;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, folded.lines(), &mut out)?;
    Ok(out)
}

/// A valid SVG with a title, a subtitle and a message.
pub fn empty_svg(title: &str, subtitle: &str, message: &str) -> String {
    format!(
        r##"<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="1200" height="130" viewBox="0 0 1200 130" xmlns="http://www.w3.org/2000/svg">
<rect x="0" y="0" width="100%" height="100%" fill="#eef2ee"/>
<text x="600" y="30" text-anchor="middle" font-family="Verdana" font-size="17">{}</text>
<text x="600" y="55" text-anchor="middle" font-family="Verdana" font-size="12" fill="#a0a0a0">{}</text>
<text x="600" y="95" text-anchor="middle" font-family="Verdana" font-size="14">{}</text>
</svg>
"##,
        xml_escape(title),
        xml_escape(subtitle),
        xml_escape(message)
    )
}

fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_frames_with_titles_and_byte_counts() {
        let folded = "pid 1: prog;main;alloc_big 3000\npid 1: prog;main;alloc_small 1000\n";
        let svg = String::from_utf8(svg(folded, Measure::Peak, "prog").unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains(Measure::Peak.title()));
        assert!(svg.contains("alloc_big (3,000 bytes, 75.00%)"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn frames_narrower_than_the_minimum_width_are_not_drawn() {
        // 0.2% and 0.05% of the total beside the rest.
        let folded = "pid 1: prog;main;wide 99750\n\
                      pid 1: prog;main;thin 200\n\
                      pid 1: prog;main;sliver 50\n";
        let svg = String::from_utf8(svg(folded, Measure::Peak, "prog").unwrap()).unwrap();
        assert!(svg.contains("wide (99,750 bytes"), "{svg}");
        assert!(svg.contains("thin (200 bytes, 0.20%)"), "{svg}");
        assert!(!svg.contains("sliver"), "{svg}");
        // Its bytes stay in its parent's width.
        assert!(svg.contains("main (100,000 bytes, 100.00%)"), "{svg}");
    }

    #[test]
    fn an_empty_graph_is_a_valid_svg_that_says_so() {
        let svg = String::from_utf8(svg("", Measure::NotFreed, "a <b> & 'c'").unwrap()).unwrap();
        assert!(svg.contains("Every byte was freed before exit"));
        assert!(svg.contains("a &lt;b&gt; &amp; &apos;c&apos;"));
        assert_eq!(svg.matches("<svg").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}

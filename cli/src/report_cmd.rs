//! `memwarden report DIR`: renders the report stage again from an earlier run's folder,
//! without running anything.

use std::io::Write;

use crate::args::ReportArgs;

/// Regenerates every report file in `args.dir` and prints the summary on stdout.
pub fn report(args: &ReportArgs, colour: bool) -> Result<(), memwarden::Error> {
    crate::output_dir::fail_writes_past_file_limit();
    let options = memwarden::report::Options {
        top: args.top,
        colour,
        symbol_cache: memwarden::symbolize::disk_cache::default_dir(),
        ..Default::default()
    };
    let done = memwarden::report::generate(&args.dir, &options)?;
    // A closed stdout (`| head`) is not an error of the report.
    let _ = std::io::stdout().write_all(done.summary.as_bytes());
    Ok(())
}

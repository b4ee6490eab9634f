//! `memwarden report DIR`: renders the report stage again from an earlier run's folder,
//! without running anything.

use std::io::Write;

use memwarden::symbolize::Symbolizer;

use crate::args::ReportArgs;

/// Regenerates every report file in `args.dir` and prints the summary on stdout. Meant to
/// be called once, by `main` just before it exits: the report's memory is left to the exit
/// ([`crate::leave_to_exit`]).
pub fn report(args: &ReportArgs, colour: bool) -> Result<(), memwarden::Error> {
    crate::output_dir::fail_writes_past_file_limit();
    let options = memwarden::report::Options {
        top: args.top,
        colour,
        symbol_cache: memwarden::symbolize::disk_cache::default_dir(),
        all_stacks: args.all_stacks,
        ..Default::default()
    };
    let mut loaded = memwarden::profile::load_dir(&args.dir)?;
    let mut symbolizer = Symbolizer::with_disk_cache(options.symbol_cache.clone());
    let nothing_ahead = memwarden::report::warm::Ahead::default();
    let done = memwarden::report::generate_loaded(
        &args.dir,
        &mut loaded,
        &options,
        &mut symbolizer,
        nothing_ahead,
    )?;
    // A closed stdout (`| head`) is not an error of the report.
    let _ = std::io::stdout().write_all(done.summary.as_bytes());
    crate::leave_to_exit((loaded, symbolizer, done));
    Ok(())
}

//! memwarden core: the reading half of the pipeline (interposed call → event → store →
//! **analysis → report**).
//!
//! The preload writes one `*.mwp` file per process image (layout in `memwarden-abi`).
//! This crate reads them back and turns them into the user's report:
//!
//! - [`profile`] reads and validates the files ([`profile::read_profile`]), and loads a
//!   whole output folder ([`profile::load_dir`]);
//! - [`run_record`] is the CLI's own `run.json` (command, reaped exit statuses);
//! - [`analysis`] applies the peak rule, infers exec replacement and settles exit statuses;
//!   [`python`] tells each stack's category (NumPy array data, interpreter objects, native);
//! - [`symbolize`] turns return addresses and Python frames into functions, files and lines;
//! - [`report`] renders `report.json`, the collapsed stacks, the flame graphs and the
//!   summary the CLI prints.
//!
//! ```no_run
//! let options = memwarden::report::Options::default();
//! let done = memwarden::report::generate(std::path::Path::new("memwarden-out"), &options)?;
//! eprint!("{}", done.summary);
//! # Ok::<(), memwarden::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod analysis;
mod error;
mod exit;
pub mod parallel;
pub mod profile;
pub mod python;
pub mod report;
pub mod run_record;
pub mod symbolize;
mod word_map;

pub use error::Error;
pub use exit::Exit;

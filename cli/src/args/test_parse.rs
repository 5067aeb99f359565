//! Parsing an `lh` command line in tests, program name left out.

use clap::Parser as _;

use super::cli::Cli;

pub(super) fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("lh").chain(args.iter().copied()))
}

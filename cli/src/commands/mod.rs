//! One room per command group of `lh`: `lh lease ...` runs in [`lease`],
//! `lh tenant ...` in [`tenant`], and so on; the flags are in `crate::args`
//! under the same name and the tables in `crate::render`. Each group's `run`
//! sends its requests and prints the answers; the dispatch is in the crate
//! root.

pub(crate) mod audit;
pub(crate) mod balance;
pub(crate) mod billing;
mod body;
pub(crate) mod data;
pub(crate) mod invoice;
pub(crate) mod key;
pub(crate) mod lease;
pub(crate) mod node;
pub(crate) mod price_book;
pub(crate) mod quote;
pub(crate) mod report;
pub(crate) mod reservation;
pub(crate) mod spot;
pub(crate) mod ssh_key;
pub(crate) mod template;
pub(crate) mod tenant;
pub(crate) mod workspace;

pub use body::MAX_JSON_FILE_BYTES;

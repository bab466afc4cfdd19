//! `sparrow-sweep`'s integration tests in one binary (one link, not one per file), one module per
//! area, each with its own doc.

mod forensics;

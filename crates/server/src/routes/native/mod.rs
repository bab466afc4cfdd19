//! SGLang's native API: `POST /generate` ([`generate`]).

mod generate;

pub(super) use generate::generate;

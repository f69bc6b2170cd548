//! Wire shapes: each parses into the decision IR and formats answers and errors its own way.

pub mod systemone;

//! placeholder until the table lands

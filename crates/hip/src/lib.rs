//! placeholder during bindgen bring-up

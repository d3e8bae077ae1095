//! spdk-sys: placeholder until its issue lands.

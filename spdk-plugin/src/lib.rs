//! spdk-plugin: placeholder until its issue lands.

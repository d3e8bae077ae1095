//! initiator-plugin: placeholder until its issue lands.

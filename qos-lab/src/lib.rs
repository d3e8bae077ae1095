//! qos-lab: placeholder until its issue lands.

"""Virtual-time fleet simulator: N simulated engines, the real control-plane weight code and the
real router policies, on one virtual clock (no sockets, no sleeps). Entry point: `tidegate simulate`."""

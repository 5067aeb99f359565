mod enforcement;
mod failover;
mod given;
mod mig;
mod placement;
mod props;
mod queue;
mod restated;

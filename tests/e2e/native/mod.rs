//! The dynamic-module load-balancing policy alone.

mod abi;
mod drain;
mod lb_policy;
mod upgrade;

//! The dynamic-module load-balancing policy alone.

mod abi;
pub(crate) mod drain;
mod lb_policy;
mod metadata_churn;
mod upgrade;

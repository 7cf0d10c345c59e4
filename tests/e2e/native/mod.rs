//! The dynamic-module load-balancing policy alone.

mod abi;
mod lb_policy;
mod metadata_churn;
mod upgrade;

//! serving-picker as an Envoy dynamic-module load-balancing policy.

//! One way to declare metrics: a group is a struct whose fields are its
//! metrics, each with its name and help (and its value, when not the
//! default), registered in the order written by the generated
//! `register(&mut Registry)`; a field's help is its doc. Each group lives
//! with its owner, which records in it: the source (`source::metrics`),
//! the publisher (`eds::metrics`), the xDS server (`xds::metrics`), the
//! plumbing (`telemetry::metrics`), TLS (`net::tls`), the status page
//! (`status`) and the Envoy Gateway hook (`envoy_gateway::service`,
//! `envoy_gateway::native_lb`); `run::Telemetry` registers the first four
//! in `/metrics` order, a mode its own before the registry is shared.

/// `metric_group! { /// doc  pub struct Name { field: Type = ("name", "help" [, value]), ... } }`
macro_rules! metric_group {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = ($metric:expr, $help:expr $(, $value:expr)?) ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* #[doc = $help] pub $field: $ty, )*
        }

        impl $name {
            /// Registers every metric of the group in `registry`, in order.
            pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
                $(
                    let $field: $ty = $crate::telemetry::registered(
                        registry,
                        $metric,
                        $help,
                        $crate::telemetry::metric_group!(@value $ty $(, $value)?),
                    );
                )*
                $name { $( $field, )* }
            }
        }
    };
    (@value $ty:ty) => { <$ty>::default() };
    (@value $ty:ty, $value:expr) => { $value };
}

pub(crate) use metric_group;

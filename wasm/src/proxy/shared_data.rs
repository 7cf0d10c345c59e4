//! `shared::SharedData` through proxy-wasm's shared-data calls (one store
//! for all of this Envoy's VMs).

use crate::shared::{SetError, SharedData};
use proxy_wasm::hostcalls::{get_shared_data, set_shared_data};
use proxy_wasm::types::Status;

pub struct EnvoyShared;

impl SharedData for EnvoyShared {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), String> {
        get_shared_data(key).map_err(|e| format!("{e:?}"))
    }

    fn set(&self, key: &str, value: Option<&[u8]>, cas: Option<u32>) -> Result<(), SetError> {
        set_shared_data(key, value, cas).map_err(|e| match e {
            Status::CasMismatch => SetError::CasMismatch,
            e => SetError::Other(format!("{e:?}")),
        })
    }
}

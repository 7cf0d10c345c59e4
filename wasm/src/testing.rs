//! Fakes of the proxy-wasm host for the native tests of `steer`, `shared` and
//! `poller`: a request, the shared-data store and the admin API, each
//! recording what was asked of it and failing where a test says so.

use crate::refresh::{AdminApi, CallRefused};
use crate::shared::{SetError, SharedData};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// A local reply as the host got it.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub status: u32,
    pub details: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// One request: its cluster, its headers (names lower-case), and what the
/// filter did to it.
#[derive(Default)]
pub struct FakeRequest {
    pub cluster: Option<Vec<u8>>,
    pub headers: Vec<(String, String)>,
    pub fail_remove: bool,
    pub fail_replace: bool,
    pub fail_reply: bool,
    pub replies: Vec<Reply>,
    /// Host calls that change the headers (each clears Envoy's route cache).
    pub header_writes: usize,
}

impl FakeRequest {
    pub fn to(cluster: &str) -> FakeRequest {
        FakeRequest {
            cluster: Some(cluster.as_bytes().to_vec()),
            ..FakeRequest::default()
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> FakeRequest {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn values(&self, name: &str) -> Vec<&str> {
        let h = self.headers.iter();
        h.filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

impl crate::steer::RequestHost for FakeRequest {
    fn cluster_name(&mut self) -> Option<Vec<u8>> {
        self.cluster.clone()
    }

    fn has_header(&mut self, name: &str) -> bool {
        // As Envoy answers `proxy_get_header_map_value`: OK with the first
        // value (no bytes when it is empty), NotFound without one.
        let first = self.headers.iter().find(|(n, _)| n == name);
        let status = match first {
            Some(_) => crate::steer::HEADER_ANSWER_OK,
            None => crate::steer::HEADER_ANSWER_NOT_FOUND,
        };
        crate::steer::header_answer_present(status)
    }

    fn remove_header(&mut self, name: &str) -> bool {
        if self.fail_remove {
            return false;
        }
        self.header_writes += 1;
        self.headers.retain(|(n, _)| n != name);
        true
    }

    fn replace_header(&mut self, name: &str, value: &str) -> bool {
        if self.fail_replace {
            return false;
        }
        self.header_writes += 1;
        self.headers.retain(|(n, _)| n != name);
        self.headers.push((name.into(), value.into()));
        true
    }

    fn local_response(
        &mut self,
        status: u32,
        details: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> bool {
        if self.fail_reply {
            return false;
        }
        self.replies.push(Reply {
            status,
            details: details.into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: String::from_utf8_lossy(body).into_owned(),
        });
        true
    }
}

/// Envoy's shared data: every write bumps the key's CAS token; a write with
/// a token other than the current one is refused.
#[derive(Default)]
pub struct FakeShared {
    pub values: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    /// Keys whose writes fail (not a CAS mismatch).
    pub broken: RefCell<Vec<String>>,
    /// Every write, in order: (key, value).
    pub writes: RefCell<Vec<(String, Vec<u8>)>>,
    /// Another VM's write, made just after the next read of that key (a
    /// lost race for the reader's token).
    pub race: RefCell<Option<(String, Vec<u8>)>>,
}

impl FakeShared {
    /// The value under the key whose name ends with `suffix`.
    pub fn value(&self, suffix: &str) -> Option<Vec<u8>> {
        let values = self.values.borrow();
        let found = values.iter().find(|(k, _)| k.ends_with(suffix));
        found.map(|(_, (v, _))| v.clone())
    }

    /// Writes a value under `key` as another VM would.
    pub fn put(&self, key: &str, value: &[u8]) {
        let mut values = self.values.borrow_mut();
        let cas = values.get(key).map_or(1, |(_, c)| c + 1);
        values.insert(key.into(), (value.to_vec(), cas));
    }
}

impl SharedData for &FakeShared {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), String> {
        let read = match self.values.borrow().get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        };
        let race = self.race.borrow_mut().take_if(|(k, _)| k == key);
        if let Some((k, v)) = race {
            self.put(&k, &v);
        }
        Ok(read)
    }

    fn set(&self, key: &str, value: Option<&[u8]>, cas: Option<u32>) -> Result<(), SetError> {
        if self
            .broken
            .borrow()
            .iter()
            .any(|k| key.ends_with(k.as_str()))
        {
            return Err(SetError::Other("InternalFailure".into()));
        }
        let mut values = self.values.borrow_mut();
        let current = values.get(key).map(|(_, c)| *c);
        if let Some(cas) = cas.filter(|c| *c != 0) {
            if current != Some(cas) {
                return Err(SetError::CasMismatch);
            }
        }
        let value = value.unwrap_or_default().to_vec();
        self.writes.borrow_mut().push((key.into(), value.clone()));
        values.insert(key.into(), (value, current.unwrap_or(0) + 1));
        Ok(())
    }
}

/// The admin API: records the paths asked, or refuses every call.
#[derive(Default)]
pub struct FakeAdmin {
    pub asked: Vec<String>,
    pub refuse: bool,
}

impl AdminApi for FakeAdmin {
    fn get(&mut self, _cluster: &str, path: &str, _timeout: Duration) -> Result<u32, CallRefused> {
        if self.refuse {
            return Err(CallRefused("BadArgument".into()));
        }
        self.asked.push(path.into());
        Ok(self.asked.len() as u32)
    }

    fn response_status(&self) -> Option<Vec<u8>> {
        None
    }

    fn response_body(&self, _size: usize) -> Option<Vec<u8>> {
        None
    }

    fn now_us(&self) -> u64 {
        0
    }
}

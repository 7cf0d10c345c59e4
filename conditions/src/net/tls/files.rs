//! The TLS files: which ones the flags name, their directories, and what
//! they held when read (an error names the flag and the file).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::TlsArgs;

/// The files of a TLS listener.
#[derive(Clone, Debug)]
pub(super) struct Files {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    pub(super) client_ca: Option<PathBuf>,
    pub(super) client_sans: Vec<String>,
}

impl Files {
    pub(super) fn from_args(args: &TlsArgs) -> Option<Files> {
        Some(Files {
            cert: args.tls_cert.clone()?,
            key: args.tls_key.clone()?,
            client_ca: args.client_ca.clone(),
            client_sans: args.client_sans.clone(),
        })
    }

    /// The directories to watch.
    pub(super) fn dirs(&self) -> BTreeSet<PathBuf> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|f| match f.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            })
            .collect()
    }
}

/// What the files held when read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Contents {
    pub(super) cert: Vec<u8>,
    pub(super) key: Vec<u8>,
    pub(super) client_ca: Option<Vec<u8>>,
}

/// A file that does not make a usable configuration: which flag, which
/// file, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The flag that named the file (`--tls-cert`, ...).
    pub flag: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub why: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.flag, self.path.display(), self.why)
    }
}

impl std::error::Error for LoadError {}

pub(super) fn fail(flag: &'static str, path: &Path, why: impl Into<String>) -> LoadError {
    LoadError {
        flag,
        path: path.to_path_buf(),
        why: why.into(),
    }
}

pub(super) fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| fail(flag, path, format!("cannot read: {e}")))
}

pub(super) fn read_all(files: &Files) -> Result<Contents, LoadError> {
    Ok(Contents {
        cert: read("--tls-cert", &files.cert)?,
        key: read("--tls-key", &files.key)?,
        client_ca: match &files.client_ca {
            Some(p) => Some(read("--client-ca", p)?),
            None => None,
        },
    })
}

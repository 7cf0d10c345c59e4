//! Byte mutations of raw bodies and node edits of JSON values, shared by
//! every parser's properties.

use crate::common::*;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::Value;

#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    Flip {
        at: usize,
        mask: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    Insert {
        at: usize,
        byte: u8,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Truncate {
        at: usize,
    },
    Duplicate {
        at: usize,
        len: usize,
    },
    /// The next letter (digit) from `at` becomes another letter (digit):
    /// usually still JSON, with a changed key, string or number.
    Alnum {
        at: usize,
        pick: u8,
    },
}

pub(crate) fn json_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => select(b"{}[]\":,-.0123456789eE+tfnul \\/\n".to_vec()),
        1 => any::<u8>(),
    ]
}

pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        3 => (at, 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        3 => (at, json_byte()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        2 => (at, json_byte()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        2 => (at, 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        1 => at.prop_map(|at| Mutation::Truncate { at }),
        1 => (at, 1usize..256).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
        6 => (at, any::<u8>()).prop_map(|(at, pick)| Mutation::Alnum { at, pick }),
    ]
}

pub(crate) fn mutate(original: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = original.to_vec();
    for m in muts {
        let pos = |at: usize, b: &Vec<u8>| if b.is_empty() { 0 } else { at % b.len() };
        match *m {
            Mutation::Flip { at, mask } if !b.is_empty() => {
                let i = pos(at, &b);
                b[i] ^= mask;
            }
            Mutation::Set { at, byte } if !b.is_empty() => {
                let i = pos(at, &b);
                b[i] = byte;
            }
            Mutation::Insert { at, byte } => {
                let i = if b.is_empty() { 0 } else { at % (b.len() + 1) };
                b.insert(i, byte);
            }
            Mutation::Delete { at, len } if !b.is_empty() => {
                let i = pos(at, &b);
                let end = (i + len).min(b.len());
                b.drain(i..end);
            }
            Mutation::Truncate { at } => {
                let i = if b.is_empty() { 0 } else { at % b.len() };
                b.truncate(i);
            }
            Mutation::Duplicate { at, len } if !b.is_empty() => {
                let i = pos(at, &b);
                let end = (i + len).min(b.len());
                let piece = b[i..end].to_vec();
                b.splice(i..i, piece);
            }
            Mutation::Alnum { at, pick } if !b.is_empty() => {
                let start = pos(at, &b);
                let found = (0..b.len())
                    .map(|k| (start + k) % b.len())
                    .find(|&k| b[k].is_ascii_alphanumeric());
                if let Some(k) = found {
                    let class: &[u8] = if b[k].is_ascii_digit() {
                        b"0123456789"
                    } else {
                        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    };
                    b[k] = class[usize::from(pick) % class.len()];
                }
            }
            _ => {}
        }
    }
    b
}

/// JSON pointers of every node, depth first.
pub(crate) fn pointers(v: &Value, here: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let k = k.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{here}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                pointers(child, format!("{here}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(here);
}

#[derive(Debug, Clone)]
pub(crate) enum Edit {
    Replace(usize, Value),
    Remove(usize),
}

pub(crate) fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<usize>(), any_json()).prop_map(|(i, v)| Edit::Replace(i, v)),
        1 => any::<usize>().prop_map(Edit::Remove),
    ]
}

/// Replaces or removes random nodes: well-formed JSON with the wrong shape.
pub(crate) fn edit_json(mut v: Value, edits: &[Edit]) -> Value {
    for e in edits {
        let mut all = Vec::new();
        pointers(&v, String::new(), &mut all);
        let pick = |i: usize| all[i % all.len()].clone();
        match e {
            Edit::Replace(i, new) => {
                let p = pick(*i);
                if let Some(node) = v.pointer_mut(&p) {
                    *node = new.clone();
                }
            }
            Edit::Remove(i) => {
                let p = pick(*i);
                let Some(cut) = p.rfind('/') else { continue };
                let (parent, key) = (&p[..cut], &p[cut + 1..]);
                let key = key.replace("~1", "/").replace("~0", "~");
                match v.pointer_mut(parent) {
                    Some(Value::Object(m)) => {
                        m.remove(&key);
                    }
                    Some(Value::Array(a)) => {
                        if let Ok(i) = key.parse::<usize>() {
                            if i < a.len() {
                                a.remove(i);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    v
}

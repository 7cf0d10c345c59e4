//! The compact snapshot the leader publishes through shared data: plans only,
//! length-prefixed binary, so workers never parse JSON.

use serving_picker_core::contract::Tier;
use serving_picker_core::plan::{ClusterPlan, PlannedHost, Topology};

const MAGIC: &[u8; 4] = b"SPK1";

/// A snapshot that does not decode, and the part that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "snapshot decode: {}", self.0)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Names and addresses are far below 64 KiB; longer ones are cut at a char boundary.
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// One plan's section: name, tier (low nibble) and topology (high nibble), hosts.
fn put_plan(out: &mut Vec<u8>, plan: &ClusterPlan) {
    put_str(out, &plan.cluster);
    out.push(plan.tier as u8 | (plan.topology as u8) << 4);
    out.extend_from_slice(&(plan.hosts.len() as u32).to_le_bytes());
    for host in &plan.hosts {
        put_str(out, &host.address);
        out.extend_from_slice(&host.weight.to_le_bytes());
    }
}

fn header(out: &mut Vec<u8>, clusters: usize) {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(clusters as u32).to_le_bytes());
}

/// The snapshot of `plans`: `SPK1`, the cluster count, then each plan's section (name, tier and
/// hint, hosts with their weights).
pub fn encode(plans: &[ClusterPlan]) -> Vec<u8> {
    let hosts: usize = plans.iter().map(|p| p.hosts.len()).sum();
    let mut out = Vec::with_capacity(16 + plans.len() * 32 + hosts * 28);
    header(&mut out, plans.len());
    for plan in plans {
        put_plan(&mut out, plan);
    }
    out
}

/// A published snapshot with some clusters' plans put in place of theirs
/// (or added): what a narrowed refresh publishes, without planning the
/// clusters that did not change. Both must be sorted by name, as
/// `build_plans` and this function leave them.
pub fn splice(snapshot: &[u8], plans: &[ClusterPlan]) -> Result<Vec<u8>, DecodeError> {
    let old = sections(snapshot)?;
    let mut body = Vec::with_capacity(snapshot.len() + plans.len() * 64);
    let mut count = 0;
    let mut fresh = plans.iter().peekable();
    for section in &old {
        while let Some(plan) = fresh.next_if(|p| p.cluster.as_str() < section.cluster) {
            put_plan(&mut body, plan);
            count += 1;
        }
        match fresh.next_if(|p| p.cluster == section.cluster) {
            Some(plan) => put_plan(&mut body, plan),
            None => body.extend_from_slice(section.bytes),
        }
        count += 1;
    }
    for plan in fresh {
        put_plan(&mut body, plan);
        count += 1;
    }
    let mut out = Vec::with_capacity(8 + body.len());
    header(&mut out, count);
    out.append(&mut body);
    Ok(out)
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let len = self.u16()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError("string is not UTF-8"))
    }

    /// A count of items of at least `min_item` bytes each, checked against what is left.
    fn count(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.rest.len() {
            return Err(DecodeError("count larger than the data"));
        }
        Ok(n)
    }
}

/// One cluster's part of a snapshot: its name and its encoded bytes. Equal
/// bytes mean an equal plan, so a worker keeps that cluster's route as it is.
#[derive(Debug, PartialEq, Eq)]
pub struct Section<'a> {
    /// The cluster's name.
    pub cluster: &'a str,
    /// Its section's bytes (name included).
    pub bytes: &'a [u8],
}

/// Splits a snapshot into its clusters' sections, checking the framing but
/// building nothing.
pub fn sections(bytes: &[u8]) -> Result<Vec<Section<'_>>, DecodeError> {
    let mut r = Reader { rest: bytes };
    if r.take(4)? != MAGIC {
        return Err(DecodeError("bad magic"));
    }
    let clusters = r.count(7)?;
    let mut out = Vec::with_capacity(clusters);
    for _ in 0..clusters {
        let start = r.rest;
        let name_len = r.u16()? as usize;
        let cluster = std::str::from_utf8(r.take(name_len)?)
            .map_err(|_| DecodeError("string is not UTF-8"))?;
        r.u8()?;
        let n = r.count(6)?;
        for _ in 0..n {
            let len = r.u16()? as usize;
            r.take(len + 4)?;
        }
        let used = start.len() - r.rest.len();
        out.push(Section {
            cluster,
            bytes: &start[..used],
        });
    }
    if !r.rest.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok(out)
}

/// One section's plan.
pub fn decode_section(section: &[u8]) -> Result<ClusterPlan, DecodeError> {
    let mut r = Reader { rest: section };
    let cluster = r.string()?;
    let code = r.u8()?;
    let tier = Tier::from_code(code & 15).ok_or(DecodeError("bad tier"))?;
    let topology = Topology::from_code(code >> 4).ok_or(DecodeError("bad tier"))?;
    let n = r.count(6)?;
    let mut hosts = Vec::with_capacity(n);
    for _ in 0..n {
        let address = r.string()?;
        let weight = r.u32()?;
        hosts.push(PlannedHost { address, weight });
    }
    if !r.rest.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok(ClusterPlan {
        cluster,
        tier,
        topology,
        hosts,
    })
}

/// Every plan of a snapshot; an error if any section does not decode.
pub fn decode(bytes: &[u8]) -> Result<Vec<ClusterPlan>, DecodeError> {
    sections(bytes)?
        .iter()
        .map(|s| decode_section(s.bytes))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<ClusterPlan> {
        vec![
            ClusterPlan {
                cluster: "backend".into(),
                tier: Tier::TerminatingFallback,
                topology: Topology::None,
                hosts: vec![
                    PlannedHost {
                        address: "10.0.0.1:80".into(),
                        weight: 3,
                    },
                    PlannedHost {
                        address: "[::1]:8080".into(),
                        weight: 1,
                    },
                ],
            },
            ClusterPlan {
                cluster: "empty".into(),
                tier: Tier::NoServing,
                topology: Topology::None,
                hosts: vec![],
            },
        ]
    }

    #[test]
    fn round_trip() {
        let plans = sample();
        assert_eq!(decode(&encode(&plans)).unwrap(), plans);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
    }

    #[test]
    fn sections_split_by_cluster_and_decode_alone() {
        let plans = sample();
        let bytes = encode(&plans);
        let parts = sections(&bytes).unwrap();
        let names: Vec<_> = parts.iter().map(|s| s.cluster).collect();
        assert_eq!(names, ["backend", "empty"]);
        for (part, plan) in parts.iter().zip(&plans) {
            assert_eq!(&decode_section(part.bytes).unwrap(), plan);
            // A section is exactly that plan's encoding, without the header.
            assert_eq!(part.bytes, &encode(std::slice::from_ref(plan))[8..]);
        }
        let mut changed = plans.clone();
        changed[0].hosts[1].weight = 2;
        let again = encode(&changed);
        let parts2 = sections(&again).unwrap();
        assert_ne!(parts[0].bytes, parts2[0].bytes);
        assert_eq!(parts[1].bytes, parts2[1].bytes);
    }

    #[test]
    fn splice_replaces_and_adds_in_name_order() {
        let plans = sample();
        let bytes = encode(&plans);
        let mut backend = plans[0].clone();
        backend.hosts.pop();
        let added = |name: &str| ClusterPlan {
            cluster: name.into(),
            tier: Tier::Ready,
            topology: Topology::Zone,
            hosts: vec![PlannedHost {
                address: "10.9.9.9:9".into(),
                weight: 1,
            }],
        };
        let patch = vec![added("a"), backend.clone(), added("c"), added("z")];
        let spliced = splice(&bytes, &patch).unwrap();
        let expected = vec![
            added("a"),
            backend,
            added("c"),
            plans[1].clone(),
            added("z"),
        ];
        assert_eq!(spliced, encode(&expected));
        assert_eq!(splice(&bytes, &[]).unwrap(), bytes);
        assert!(splice(b"junk", &patch).is_err());
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let bytes = encode(&sample());
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
            assert!(sections(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0xff;
            let _ = decode(&bad);
            for part in sections(&bad).unwrap_or_default() {
                let _ = decode_section(part.bytes);
            }
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(decode(&trailing), Err(DecodeError("trailing bytes")));
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode(&huge),
            Err(DecodeError("count larger than the data"))
        );
    }
}

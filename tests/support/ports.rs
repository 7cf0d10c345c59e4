//! Process-wide port allocator for the ports Envoy binds itself (listener,
//! admin). Starts from a random base in 30000..=39999 and hands out ports
//! that were free when checked; callers retry if Envoy still loses a race.

use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

const LOW: u16 = 30000;
const HIGH: u16 = 39999;

static NEXT: Mutex<Option<u16>> = Mutex::new(None);

fn random_base() -> u16 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ d.as_secs())
        .unwrap_or(0);
    let mix = nanos
        .wrapping_mul(6364136223846793005)
        .wrapping_add((std::process::id() as u64).wrapping_mul(1442695040888963407));
    LOW + ((mix >> 33) % u64::from(HIGH - LOW + 1)) as u16
}

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut port = next.unwrap_or_else(random_base);
    for _ in 0..=(HIGH - LOW) {
        let candidate = port;
        port = if port >= HIGH { LOW } else { port + 1 };
        if TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            *next = Some(port);
            return candidate;
        }
    }
    panic!("no free loopback port in {LOW}..={HIGH}");
}

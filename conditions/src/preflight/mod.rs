//! `serving-picker-conditions preflight`: what a platform team runs before
//! installing. It reads the cluster through a kubeconfig ([`gather`]: the
//! API's version, the companion's RBAC as a SubjectAccessReview, the CRDs,
//! every Envoy Gateway or istiod wherever it runs, the Secrets the peers
//! read, the labelled Services), judges what it read ([`checks`] and the
//! modules it calls: plain functions, tested without a cluster) against what
//! upstream states ([`versions`]) and prints one line per check with the
//! fix. A look it could not take is a line too, never a silent skip. Exit
//! code 1 when a check fails.

pub mod certificates;
pub mod checks;
pub mod eg_checks;
pub mod eg_document;
pub mod facts;
pub mod finding;
pub mod gather;
pub mod istio;
pub mod versions;

use finding::{Finding, Level};

/// Runs the preflight and prints its findings; whether none failed.
pub async fn run(args: gather::Args) -> anyhow::Result<bool> {
    let facts = gather::gather(&args).await?;
    let findings = checks::judge(&args.expect(), &facts, std::time::SystemTime::now());
    print(&findings);
    Ok(findings.iter().all(|f| f.level != Level::Fail))
}

fn print(findings: &[Finding]) {
    for f in findings {
        println!("{:<4} {:<12} {}", f.level.word(), f.check, f.detail);
        if let Some(fix) = &f.fix {
            println!("     {:<12} fix: {fix}", "");
        }
    }
    let fails = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warns = findings.iter().filter(|f| f.level == Level::Warn).count();
    println!(
        "preflight: {} checks, {fails} failed, {warns} warnings",
        findings.len()
    );
}

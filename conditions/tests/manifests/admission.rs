//! The native overlay's ValidatingAdmissionPolicy
//! (deploy/envoy-gateway-native/gateway-keeps-module.yaml) judged on
//! Gateways that Envoy Gateway's Gateway CRD accepts at every claimed tag:
//! a Gateway of class serving-picker that names an EnvoyProxy of its own
//! (`spec.infrastructure.parametersRef`) is refused, at create and at
//! update; one without it is admitted, with or without other
//! `infrastructure`; a Gateway of another class is never judged; the
//! Gateway's status subresource is never matched. The object itself is
//! checked against k8s-openapi's types by conditions/tests/manifests/kubernetes.rs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use serving_picker_platforms::admission::{judge, Verdict};
use serving_picker_platforms::crds;
use serving_picker_platforms::objects::repo;
use serving_picker_platforms::rules::Rules;
use serving_picker_platforms::schema::validate;

const FILE: &str = "deploy/envoy-gateway-native/gateway-keeps-module.yaml";

fn policy() -> Value {
    let text = std::fs::read_to_string(repo().join(FILE)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap_or_else(|| panic!("{FILE}: no ValidatingAdmissionPolicy"))
}

fn gateway(class: &str, infrastructure: Option<Value>) -> Value {
    let mut g = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "eg", "namespace": "default"},
        "spec": {
            "gatewayClassName": class,
            "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]
        }
    });
    if let Some(i) = infrastructure {
        g["spec"]["infrastructure"] = i;
    }
    g
}

#[test]
fn a_gateway_of_the_class_keeps_the_classs_envoy_proxy() {
    let policy = policy();
    let own_proxy = json!({"parametersRef": {"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": "mine"}});
    let labels_only = json!({"labels": {"team": "shop"}});
    let cases = [
        (gateway("serving-picker", None), "admitted"),
        (
            gateway("serving-picker", Some(labels_only.clone())),
            "admitted",
        ),
        (
            gateway("serving-picker", Some(own_proxy.clone())),
            "refused",
        ),
        (gateway("eg", Some(own_proxy.clone())), "skipped"),
        (gateway("eg", None), "skipped"),
    ];
    // Each Gateway is one EG's Gateway CRD accepts at every claimed tag:
    // the fields the expressions read are the CRD's.
    let rules = Rules::new();
    let releases: Vec<_> = crds::releases(&crds::root())
        .unwrap()
        .into_iter()
        .filter(|r| r.platform == "envoy-gateway")
        .collect();
    assert!(releases.len() >= 2, "EG releases under platforms/crds/");
    for r in &releases {
        let (schema, _) = r
            .schema("gateway.networking.k8s.io", "v1", "Gateway")
            .unwrap();
        for (g, _) in &cases {
            let report = validate(schema, g, &rules);
            assert!(
                report.errors.is_empty(),
                "EG {}: the Gateway CRD refuses {g}: {:?}",
                r.tag,
                report.errors
            );
        }
    }
    for operation in ["CREATE", "UPDATE"] {
        for (g, want) in &cases {
            let got = judge(
                &policy,
                operation,
                ("gateway.networking.k8s.io", "v1", "gateways"),
                g,
            )
            .unwrap_or_else(|e| panic!("{FILE}: {e}"));
            let got_name = match &got {
                Verdict::Admitted => "admitted",
                Verdict::Refused(m) => {
                    assert!(
                        m.contains("parametersRef"),
                        "the message names the field: {m}"
                    );
                    "refused"
                }
                Verdict::Skipped(_) => "skipped",
                Verdict::NotMatched => "not matched",
            };
            assert_eq!(got_name, *want, "{operation} {g}: {got:?}");
            println!(
                "{operation} class {} infrastructure {}: {got_name}",
                g["spec"]["gatewayClassName"], g["spec"]["infrastructure"]
            );
        }
    }
    // EG's status writes (gateways/status) and deletes are not matched.
    let g = gateway("serving-picker", Some(own_proxy));
    for (op, resource) in [("UPDATE", "gateways/status"), ("DELETE", "gateways")] {
        assert_eq!(
            judge(
                &policy,
                op,
                ("gateway.networking.k8s.io", "v1", resource),
                &g
            )
            .unwrap(),
            Verdict::NotMatched,
            "{op} {resource}"
        );
    }
}

//! Keeps `schemas/audit-chain.md` honest: its worked example is computed
//! here with the production code, and every value must appear in the page.

use ed25519_dalek::SigningKey;
use lh_domain::chain::{checkpoint_statement, Chain};

use crate::signing::{checkpoint_signature_ok, sign_checkpoint};

const SPEC: &str = include_str!("../../../schemas/audit-chain.md");

const H1: &str = "bb16d1bfa2ee53115a3016bca61c45f0a5c0e90b746115f5d342e74c5b6d6101";
const H2: &str = "170ccffff103d5b0fc20a6b022e0f233d42e2c6e5eac7a6f479988478d1bb490";
const SEED: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const PUBLIC_KEY: &str = "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8";
const SIGNATURE: &str = "6fbb116dfcbeeaa301ad94e8de8b4f3ed0c3b5391e017e0fba98308323513074c43952b4a2d79243717b58cd9df3a222e6da4158fa27bad57b2824a31437dd0a";

#[test]
fn the_worked_example_matches_the_code() {
    let mut chain = Chain::default();
    assert_eq!(
        hex::encode(chain.append(1, "lh.evt.tenant.t1", br#"{"n":1}"#)),
        H1
    );
    assert_eq!(
        hex::encode(chain.append(2, "lh.evt.lease.l1", br#"{"n":2}"#)),
        H2
    );
    assert_eq!(chain.events, 2);

    let statement = checkpoint_statement(2, 2, &chain.head);
    assert_eq!(statement, format!("leasehold-audit-checkpoint:v1:2:2:{H2}"));

    let seed: [u8; 32] = hex::decode(SEED).unwrap().try_into().unwrap();
    let key = SigningKey::from_bytes(&seed);
    assert_eq!(hex::encode(key.verifying_key().to_bytes()), PUBLIC_KEY);
    let signature = sign_checkpoint(&key, 2, 2, &chain.head).to_bytes();
    assert_eq!(hex::encode(signature), SIGNATURE);
    assert!(checkpoint_signature_ok(
        &hex::decode(PUBLIC_KEY).unwrap(),
        &signature,
        2,
        2,
        &chain.head
    ));

    for value in [H1, H2, SEED, PUBLIC_KEY, SIGNATURE, statement.as_str()] {
        assert!(SPEC.contains(value), "schemas/audit-chain.md lacks {value}");
    }
    // The Python example splits the signature over two lines.
    assert!(SPEC.contains(&SIGNATURE[..64]) && SPEC.contains(&SIGNATURE[64..]));
}

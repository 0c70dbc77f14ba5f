//! The guard in front of a tonic service: who may call each method, declared once where the
//! service is installed, checked before the request reaches the service.
//!
//! ```text
//! routes.add_service(Guarded::new(OperatorServer::new(svc), operator_rules(), &security, tokens))
//! ```
//!
//! A request passes when the caller's certificate carries an accepted role and, where the
//! method needs a permission, the request carries a token (`x-muster-token` or
//! `authorization: Bearer`) whose policy grants it. The guard puts the [`Peer`] and the
//! [`Caller`] in the request's extensions. Without TLS ([`Security::Insecure`]) every request
//! passes as [`Caller::insecure`].

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::acl::{Caller, Permission, TokenSecret};
use crate::identity::{Peer, Role};
use crate::tls::{Security, Tls};

/// The metadata key a token travels in.
pub const TOKEN_HEADER: &str = "x-muster-token";

/// What one method asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// A certificate of one of these roles; no token (raft between masters; bootstrapping
    /// the ACL system, which the registry allows once).
    Certificate(&'static [Role]),
    /// A certificate of one of these roles and a token granting the permission.
    Token(&'static [Role], Permission),
}

/// Who may call each method of one service.
#[derive(Clone, Debug)]
pub struct Rules {
    default: Requirement,
    methods: HashMap<&'static str, Requirement>,
}

impl Rules {
    /// Rules where every method asks `default`.
    pub fn new(default: Requirement) -> Rules {
        Rules {
            default,
            methods: HashMap::new(),
        }
    }

    /// `method` (its name alone, `SubmitJob`) asks `requirement` instead.
    #[must_use]
    pub fn method(mut self, method: &'static str, requirement: Requirement) -> Rules {
        self.methods.insert(method, requirement);
        self
    }

    /// What `method` asks.
    pub fn requirement(&self, method: &str) -> Requirement {
        self.methods.get(method).copied().unwrap_or(self.default)
    }
}

/// Where the guard looks tokens up: the registry's applied tokens and policies, so a deleted
/// token is refused, and a changed policy applies, as soon as the change applies.
pub trait TokenSource: Send + Sync + 'static {
    /// Who holds `secret`: its token's name and what its policies allow; `None` for a secret
    /// no token has.
    fn authenticate(&self, secret: &TokenSecret) -> Option<Caller>;
}

/// A tonic service behind a guard.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    rules: Arc<Rules>,
    tls: Option<Tls>,
    tokens: Arc<dyn TokenSource>,
}

impl<S> std::fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl<S> Guarded<S> {
    /// `inner`, guarded by `rules`, with tokens from `tokens`.
    pub fn new(
        inner: S,
        rules: Rules,
        security: &Security,
        tokens: Arc<dyn TokenSource>,
    ) -> Guarded<S> {
        Guarded {
            inner,
            rules: Arc::new(rules),
            tls: security.tls().cloned(),
            tokens,
        }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

/// The token a request carries, if any.
pub fn token_of(headers: &http::HeaderMap) -> Option<TokenSecret> {
    if let Some(value) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(TokenSecret::new(value.trim()));
    }
    // `Bearer <token>`, the scheme in any case (RFC 7235, section 2.1).
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| TokenSecret::new(token))
}

/// Checks one request against `requirement`: the [`Peer`] and [`Caller`] it passes as, or
/// the status to refuse it with.
fn check<B>(
    tls: &Tls,
    tokens: &dyn TokenSource,
    requirement: Requirement,
    request: &http::Request<B>,
) -> Result<(Peer, Caller), Status> {
    let chain = request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.peer_certs());
    let path = request.uri().path();
    let (roles, permission) = match requirement {
        Requirement::Certificate(roles) => (roles, None),
        Requirement::Token(roles, permission) => (roles, Some(permission)),
    };
    let peer = tls
        .peer_of(chain.as_deref().map(Vec::as_slice))
        .and_then(|peer| peer.expect(roles))
        .map_err(|e| Status::permission_denied(format!("{path}: {e}")))?;
    let Some(permission) = permission else {
        let caller = Caller {
            name: peer.name.clone(),
            policies: Vec::new(),
            acl: crate::policy::Acl::management(),
        };
        return Ok((peer, caller));
    };
    let caller = token_caller(tokens, request.headers(), permission)?;
    Ok((peer, caller))
}

/// Who the token in `headers` speaks for, if it grants `permission`; else the status to
/// refuse the request with (`UNAUTHENTICATED` for no token or an unknown one,
/// `PERMISSION_DENIED` naming what is needed). The gRPC guard and the HTTP API both use it.
///
/// # Errors
/// As above.
pub fn token_caller(
    tokens: &dyn TokenSource,
    headers: &http::HeaderMap,
    permission: Permission,
) -> Result<Caller, Status> {
    let secret = token_of(headers).ok_or_else(|| {
        Status::unauthenticated(
            "no token; set MUSTER_TOKEN or --token (HTTP: an X-Muster-Token or Authorization: Bearer header)",
        )
    })?;
    let caller = tokens.authenticate(&secret).ok_or_else(|| {
        Status::unauthenticated("the token is not known (deleted, or never issued by this cluster)")
    })?;
    if !caller.may(permission) {
        return Err(Status::permission_denied(format!(
            "token {} may not make this call: it needs {}",
            caller.described(),
            permission.needs()
        )));
    }
    Ok(caller)
}

impl<S, B> tower_service::Service<http::Request<B>> for Guarded<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util::future::Either<
        S::Future,
        std::future::Ready<Result<Self::Response, Self::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let Some(tls) = &self.tls else {
            request.extensions_mut().insert(Caller::insecure());
            return futures_util::future::Either::Left(self.inner.call(request));
        };
        let method = request.uri().path().rsplit('/').next().unwrap_or_default();
        let requirement = self.rules.requirement(method);
        match check(tls, self.tokens.as_ref(), requirement, &request) {
            Ok((peer, caller)) => {
                request.extensions_mut().insert(peer);
                request.extensions_mut().insert(caller);
                futures_util::future::Either::Left(self.inner.call(request))
            }
            Err(status) => {
                tracing::debug!(path = %request.uri().path(), code = ?status.code(), "refused");
                futures_util::future::Either::Right(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// A token source with no tokens (a cluster whose registry has none yet refuses every
/// token).
#[derive(Debug, Default)]
pub struct NoTokens;

impl TokenSource for NoTokens {
    fn authenticate(&self, _secret: &TokenSecret) -> Option<Caller> {
        None
    }
}

/// A client-side interceptor that sends a token with every request (the CLI's `--token`,
/// remote scheduler workers); without a token it sends none.
#[derive(Clone, Debug, Default)]
pub struct WithToken {
    value: Option<tonic::metadata::AsciiMetadataValue>,
}

/// A token that cannot travel as gRPC metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the token holds characters that cannot be sent (printable ASCII only)")]
pub struct BadToken;

impl WithToken {
    /// Sends `token`, if given.
    ///
    /// # Errors
    /// [`BadToken`] if it holds characters metadata cannot carry.
    pub fn new(token: Option<&TokenSecret>) -> Result<WithToken, BadToken> {
        let value = token
            .map(|t| t.expose().parse().map_err(|_| BadToken))
            .transpose()?;
        Ok(WithToken { value })
    }
}

impl tonic::service::Interceptor for WithToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.value {
            request.metadata_mut().insert(TOKEN_HEADER, value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, value: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            http::HeaderValue::from_str(value).expect("a header value"),
        );
        headers
    }

    #[test]
    fn a_bearer_token_is_read_whatever_the_case_of_its_scheme() {
        for value in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER  s3cret ",
            " Bearer s3cret",
        ] {
            let token = token_of(&with("authorization", value));
            assert_eq!(
                token.map(|t| t.expose().to_owned()).as_deref(),
                Some("s3cret"),
                "{value:?}"
            );
        }
        for value in ["Basic s3cret", "Bearer", "Bearer   ", "Bearers3cret"] {
            assert!(
                token_of(&with("authorization", value)).is_none(),
                "{value:?}"
            );
        }
        let token = token_of(&with(TOKEN_HEADER, " s3cret "));
        assert_eq!(
            token.map(|t| t.expose().to_owned()).as_deref(),
            Some("s3cret")
        );
    }
}

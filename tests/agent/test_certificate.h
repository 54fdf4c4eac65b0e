#pragma once
// A self-signed TLS certificate (EC P-256, CN=localhost, SAN localhost and
// 127.0.0.1, CA:TRUE so clients can pin it as their root) for the TCP tests,
// made with the OpenSSL library: no openssl binary needed.

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <string>

namespace gaugewatch::agent {

inline bool write_self_signed_certificate(const std::string& cert_path, const std::string& key_path) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key == nullptr) return false;
  X509* cert = X509_new();
  bool ok = cert != nullptr;
  if (ok) {
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
    X509_set_version(cert, 2);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    for (auto [nid, value] : {std::pair<int, const char*>{NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"},
                              {NID_basic_constraints, "critical,CA:TRUE"},
                              {NID_key_usage, "critical,digitalSignature,keyCertSign"}}) {
      X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      ok = ok && ext != nullptr && X509_add_ext(cert, ext, -1) == 1;
      X509_EXTENSION_free(ext);
    }
    ok = ok && X509_sign(cert, key, EVP_sha256()) > 0;
  }
  if (ok) {
    BIO* out = BIO_new_file(cert_path.c_str(), "w");
    ok = out != nullptr && PEM_write_bio_X509(out, cert) == 1;
    BIO_free(out);
  }
  if (ok) {
    BIO* out = BIO_new_file(key_path.c_str(), "w");
    ok = out != nullptr && PEM_write_bio_PrivateKey(out, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    BIO_free(out);
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  return ok;
}

}  // namespace gaugewatch::agent

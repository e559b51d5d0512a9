/* Private: OpenSSL (libssl, and libcrypto under it) loaded at run time, on the
 * first use of what needs it: a secret (MLXDIST_SECRET_FILE: HMAC-SHA256,
 * SHA-256) or TLS (MLXDIST_TLS=1). A process that needs neither never maps
 * them: relocating libcrypto cost every rank ~3 million instructions and ~140
 * page faults at start (docs/scale.md).
 *
 * The two users (secret.c, tls.c) include this header after OpenSSL's own:
 * each OpenSSL function they call is a macro naming its pointer in
 * mlxd_ossl, whose type is the function's own (__typeof__ of OpenSSL's
 * declaration), so every call is checked against OpenSSL's headers as a
 * direct call would be. OpenSSL's function-like macros (BIO_set_retry_read,
 * SSL_CTX_set_min_proto_version, ...) expand to these names and work too.
 * Only after mlxd_crypto_init() returned 0 may any of them be called. A
 * function added to a user must be added to MLXD_OSSL_FNS and below
 * (tests/config: config_no_openssl_link checks the library links no OpenSSL). */
#ifndef MLXD_OSSL_H
#define MLXD_OSSL_H

#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>

#include "util/status.h"

#define MLXD_OSSL_FNS(X)                   \
  X(BIO_clear_flags)                       \
  X(BIO_free)                              \
  X(BIO_get_data)                          \
  X(BIO_get_new_index)                     \
  X(BIO_meth_free)                         \
  X(BIO_meth_new)                          \
  X(BIO_meth_set_ctrl)                     \
  X(BIO_meth_set_read)                     \
  X(BIO_meth_set_write)                    \
  X(BIO_new)                               \
  X(BIO_set_data)                          \
  X(BIO_set_flags)                         \
  X(BIO_set_init)                          \
  X(ERR_clear_error)                       \
  X(ERR_error_string_n)                    \
  X(ERR_peek_last_error)                   \
  X(EVP_DigestFinal_ex)                    \
  X(EVP_DigestInit_ex)                     \
  X(EVP_DigestUpdate)                      \
  X(EVP_MAC_CTX_free)                      \
  X(EVP_MAC_CTX_new)                       \
  X(EVP_MAC_fetch)                         \
  X(EVP_MAC_final)                         \
  X(EVP_MAC_free)                          \
  X(EVP_MAC_init)                          \
  X(EVP_MAC_update)                        \
  X(EVP_MD_CTX_free)                       \
  X(EVP_MD_CTX_new)                        \
  X(EVP_sha256)                            \
  X(OPENSSL_cleanse)                       \
  X(OPENSSL_init_ssl)                      \
  X(OSSL_PARAM_construct_end)              \
  X(OSSL_PARAM_construct_utf8_string)      \
  X(SHA256)                                \
  X(SSL_CIPHER_find)                       \
  X(SSL_CIPHER_get_handshake_digest)       \
  X(SSL_CTX_ctrl)                          \
  X(SSL_CTX_free)                          \
  X(SSL_CTX_new)                           \
  X(SSL_CTX_set_ciphersuites)              \
  X(SSL_CTX_set_default_read_buffer_len)   \
  X(SSL_CTX_set_num_tickets)               \
  X(SSL_CTX_set_options)                   \
  X(SSL_CTX_set_psk_find_session_callback) \
  X(SSL_CTX_set_psk_use_session_callback)  \
  X(SSL_SESSION_free)                      \
  X(SSL_SESSION_new)                       \
  X(SSL_SESSION_set1_master_key)           \
  X(SSL_SESSION_set_cipher)                \
  X(SSL_SESSION_set_protocol_version)      \
  X(SSL_SESSION_up_ref)                    \
  X(SSL_do_handshake)                      \
  X(SSL_free)                              \
  X(SSL_get_error)                         \
  X(SSL_get_ex_data)                       \
  X(SSL_is_init_finished)                  \
  X(SSL_new)                               \
  X(SSL_pending)                           \
  X(SSL_read_ex)                           \
  X(SSL_set_accept_state)                  \
  X(SSL_set_bio)                           \
  X(SSL_set_connect_state)                 \
  X(SSL_set_ex_data)                       \
  X(SSL_shutdown)                          \
  X(SSL_write_ex)                          \
  X(TLS_method)

typedef struct mlxd_ossl_table {
#define MLXD_OSSL_MEMBER(f) __typeof__(f)* f;
  MLXD_OSSL_FNS(MLXD_OSSL_MEMBER)
#undef MLXD_OSSL_MEMBER
} mlxd_ossl_table;

/* Filled once by mlxd_crypto_init (secret.h); read-only after. */
extern mlxd_ossl_table mlxd_ossl;

#ifndef MLXD_OSSL_NO_MACROS
#define BIO_clear_flags (mlxd_ossl.BIO_clear_flags)
#define BIO_free (mlxd_ossl.BIO_free)
#define BIO_get_data (mlxd_ossl.BIO_get_data)
#define BIO_get_new_index (mlxd_ossl.BIO_get_new_index)
#define BIO_meth_free (mlxd_ossl.BIO_meth_free)
#define BIO_meth_new (mlxd_ossl.BIO_meth_new)
#define BIO_meth_set_ctrl (mlxd_ossl.BIO_meth_set_ctrl)
#define BIO_meth_set_read (mlxd_ossl.BIO_meth_set_read)
#define BIO_meth_set_write (mlxd_ossl.BIO_meth_set_write)
#define BIO_new (mlxd_ossl.BIO_new)
#define BIO_set_data (mlxd_ossl.BIO_set_data)
#define BIO_set_flags (mlxd_ossl.BIO_set_flags)
#define BIO_set_init (mlxd_ossl.BIO_set_init)
#define ERR_clear_error (mlxd_ossl.ERR_clear_error)
#define ERR_error_string_n (mlxd_ossl.ERR_error_string_n)
#define ERR_peek_last_error (mlxd_ossl.ERR_peek_last_error)
#define EVP_DigestFinal_ex (mlxd_ossl.EVP_DigestFinal_ex)
#define EVP_DigestInit_ex (mlxd_ossl.EVP_DigestInit_ex)
#define EVP_DigestUpdate (mlxd_ossl.EVP_DigestUpdate)
#define EVP_MAC_CTX_free (mlxd_ossl.EVP_MAC_CTX_free)
#define EVP_MAC_CTX_new (mlxd_ossl.EVP_MAC_CTX_new)
#define EVP_MAC_fetch (mlxd_ossl.EVP_MAC_fetch)
#define EVP_MAC_final (mlxd_ossl.EVP_MAC_final)
#define EVP_MAC_free (mlxd_ossl.EVP_MAC_free)
#define EVP_MAC_init (mlxd_ossl.EVP_MAC_init)
#define EVP_MAC_update (mlxd_ossl.EVP_MAC_update)
#define EVP_MD_CTX_free (mlxd_ossl.EVP_MD_CTX_free)
#define EVP_MD_CTX_new (mlxd_ossl.EVP_MD_CTX_new)
#define EVP_sha256 (mlxd_ossl.EVP_sha256)
#define OPENSSL_cleanse (mlxd_ossl.OPENSSL_cleanse)
#define OPENSSL_init_ssl (mlxd_ossl.OPENSSL_init_ssl)
#define OSSL_PARAM_construct_end (mlxd_ossl.OSSL_PARAM_construct_end)
#define OSSL_PARAM_construct_utf8_string (mlxd_ossl.OSSL_PARAM_construct_utf8_string)
#define SHA256 (mlxd_ossl.SHA256)
#define SSL_CIPHER_find (mlxd_ossl.SSL_CIPHER_find)
#define SSL_CIPHER_get_handshake_digest (mlxd_ossl.SSL_CIPHER_get_handshake_digest)
#define SSL_CTX_ctrl (mlxd_ossl.SSL_CTX_ctrl)
#define SSL_CTX_free (mlxd_ossl.SSL_CTX_free)
#define SSL_CTX_new (mlxd_ossl.SSL_CTX_new)
#define SSL_CTX_set_ciphersuites (mlxd_ossl.SSL_CTX_set_ciphersuites)
#define SSL_CTX_set_default_read_buffer_len (mlxd_ossl.SSL_CTX_set_default_read_buffer_len)
#define SSL_CTX_set_num_tickets (mlxd_ossl.SSL_CTX_set_num_tickets)
#define SSL_CTX_set_options (mlxd_ossl.SSL_CTX_set_options)
#define SSL_CTX_set_psk_find_session_callback (mlxd_ossl.SSL_CTX_set_psk_find_session_callback)
#define SSL_CTX_set_psk_use_session_callback (mlxd_ossl.SSL_CTX_set_psk_use_session_callback)
#define SSL_SESSION_free (mlxd_ossl.SSL_SESSION_free)
#define SSL_SESSION_new (mlxd_ossl.SSL_SESSION_new)
#define SSL_SESSION_set1_master_key (mlxd_ossl.SSL_SESSION_set1_master_key)
#define SSL_SESSION_set_cipher (mlxd_ossl.SSL_SESSION_set_cipher)
#define SSL_SESSION_set_protocol_version (mlxd_ossl.SSL_SESSION_set_protocol_version)
#define SSL_SESSION_up_ref (mlxd_ossl.SSL_SESSION_up_ref)
#define SSL_do_handshake (mlxd_ossl.SSL_do_handshake)
#define SSL_free (mlxd_ossl.SSL_free)
#define SSL_get_error (mlxd_ossl.SSL_get_error)
#define SSL_get_ex_data (mlxd_ossl.SSL_get_ex_data)
#define SSL_is_init_finished (mlxd_ossl.SSL_is_init_finished)
#define SSL_new (mlxd_ossl.SSL_new)
#define SSL_pending (mlxd_ossl.SSL_pending)
#define SSL_read_ex (mlxd_ossl.SSL_read_ex)
#define SSL_set_accept_state (mlxd_ossl.SSL_set_accept_state)
#define SSL_set_bio (mlxd_ossl.SSL_set_bio)
#define SSL_set_connect_state (mlxd_ossl.SSL_set_connect_state)
#define SSL_set_ex_data (mlxd_ossl.SSL_set_ex_data)
#define SSL_shutdown (mlxd_ossl.SSL_shutdown)
#define SSL_write_ex (mlxd_ossl.SSL_write_ex)
#define TLS_method (mlxd_ossl.TLS_method)
#endif

#endif

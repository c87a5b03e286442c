//===- ReviewKey.h - approvals a hand edit cannot forge ----------*- C++ -*-===//
//
// An approval in review.json, and each generated operator an exported
// registry carries, holds an HMAC-SHA256 under a key kept outside every
// workspace (docs/security.md#review-integrity): rewriting a file and its
// hash in review.json, or writing an "approved" registry entry by hand,
// gives no valid MAC, so `adapt review` does not count it and `adapt build`
// refuses it. The key: $ADAPT_REVIEW_KEY_FILE, else
// $XDG_CONFIG_HOME/adapt/review.key, else ~/.config/adapt/review.key; 32
// random bytes made on the first approval (file 0600, folder 0700).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_REVIEWKEY_H
#define ADAPT_AGENT_REVIEWKEY_H

#include <string>

namespace adapt::agent {

/// Where the review key lives (see above).
std::string reviewKeyPath();

/// Reads the review key into \p key; with \p create, makes it when absent.
/// False + \p error when it cannot be read (or made), or is not 32 bytes of
/// a regular file.
bool reviewKey(std::string &key, bool create, std::string &error);

/// Lowercase hex HMAC-SHA256 (RFC 2104) of \p message under \p key.
std::string hmacSha256Hex(const std::string &key, const std::string &message);

/// The MAC of one approval: what was approved (\p subject: a candidate id or a
/// generated registry entry's candidate), the SHA-256 of what was shown or
/// compiled, and who approved it.
std::string approvalMac(const std::string &key, const std::string &subject, const std::string &sha256,
                        const std::string &by);

} // namespace adapt::agent

#endif // ADAPT_AGENT_REVIEWKEY_H

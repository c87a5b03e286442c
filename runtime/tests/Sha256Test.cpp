//===- Sha256Test.cpp - SHA-256 against FIPS 180-4 test vectors -----------===//
//
// Validation records and fixtures are matched by SHA-256; a wrong digest
// would let a record vouch for other code or a fixture meet other weights.
//
//===----------------------------------------------------------------------===//

#include "runtime/Sha256.h"

#include <gtest/gtest.h>

#include <string>

using namespace adapt::rt;

TEST(Sha256Test, MatchesStandardVectors) {
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, IncrementalEqualsOneShotAcrossBlockBoundaries) {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += char('a' + i % 26);
  for (size_t split : {0, 1, 55, 56, 63, 64, 65, 128, 299}) {
    Sha256 h;
    h.update(text.data(), split);
    h.update(text.data() + split, text.size() - split);
    EXPECT_EQ(h.hex(), sha256Hex(text)) << "split at " << split;
  }
}

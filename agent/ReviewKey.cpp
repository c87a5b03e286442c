//===- ReviewKey.cpp - approvals a hand edit cannot forge -----------------===//

#include "agent/ReviewKey.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/SHA256.h"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace adapt::agent {

namespace {

constexpr size_t kKeyBytes = 32;

std::array<uint8_t, 32> sha256(const std::string &data) {
  return llvm::SHA256::hash(llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(data.data()), data.size()));
}

/// Creates every missing folder of \p dir with mode 0700.
void makePrivateDirs(const std::string &dir) {
  for (size_t slash = dir.find('/', 1); ; slash = dir.find('/', slash + 1)) {
    ::mkdir(dir.substr(0, slash).c_str(), 0700);
    if (slash == std::string::npos)
      break;
  }
}

} // namespace

std::string reviewKeyPath() {
  if (const char *file = std::getenv("ADAPT_REVIEW_KEY_FILE"); file && *file)
    return file;
  if (const char *config = std::getenv("XDG_CONFIG_HOME"); config && *config == '/')
    return std::string(config) + "/adapt/review.key";
  const char *home = std::getenv("HOME");
  return std::string(home && *home ? home : "/root") + "/.config/adapt/review.key";
}

bool reviewKey(std::string &key, bool create, std::string &error) {
  const std::string path = reviewKeyPath();
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (!create) {
      error = path + ": no review key (it is made by the first `adapt review --approve` on this machine)";
      return false;
    }
    makePrivateDirs(path.substr(0, path.rfind('/')));
    std::ifstream random("/dev/urandom", std::ios::binary);
    std::string bytes(kKeyBytes, '\0');
    random.read(bytes.data(), kKeyBytes);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (!random || fd < 0 || ::write(fd, bytes.data(), kKeyBytes) != ssize_t(kKeyBytes) || ::fsync(fd) != 0) {
      if (fd >= 0)
        ::close(fd);
      error = path + ": cannot make the review key";
      return false;
    }
    ::close(fd);
    key = bytes;
    return true;
  }
  if (!S_ISREG(st.st_mode) || st.st_size != off_t(kKeyBytes)) {
    error = path + ": expected the 32-byte review key (a regular file)";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  key.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (key.size() != kKeyBytes) {
    error = path + ": cannot read the review key";
    return false;
  }
  return true;
}

std::string hmacSha256Hex(const std::string &key, const std::string &message) {
  std::string block = key.size() > 64 ? std::string(reinterpret_cast<const char *>(sha256(key).data()), 32) : key;
  block.resize(64, '\0');
  std::string inner(64, '\0'), outer(64, '\0');
  for (size_t i = 0; i < 64; ++i) {
    inner[i] = char(block[i] ^ 0x36);
    outer[i] = char(block[i] ^ 0x5c);
  }
  std::array<uint8_t, 32> in = sha256(inner + message);
  std::array<uint8_t, 32> mac = sha256(outer + std::string(reinterpret_cast<const char *>(in.data()), 32));
  static const char *hex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : mac)
    out += hex[b >> 4], out += hex[b & 15];
  return out;
}

std::string approvalMac(const std::string &key, const std::string &subject, const std::string &sha256Hex,
                        const std::string &by) {
  return hmacSha256Hex(key, "adapt-approval-v1\n" + subject + "\n" + sha256Hex + "\n" + by);
}

} // namespace adapt::agent

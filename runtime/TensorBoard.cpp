//===- TensorBoard.cpp - scalar curves as TensorBoard event files ---------===//
//
// The protobuf wire format of the fields written (tensorflow/core/util/
// event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
//
//===----------------------------------------------------------------------===//

#include "runtime/TensorBoard.h"

#include "runtime/Errors.h"
#include "runtime/FileSystem.h"

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace adapt::rt {

namespace {

/// The reflected CRC-32C table (polynomial 0x82F63B78).
std::array<uint32_t, 256> crcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

/// TFRecord's masked CRC: rotate right by 15 and add a constant.
uint32_t maskedCrc(const void *data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void varint(std::string &out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

template <typename T> void littleEndian(std::string &out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T)); // x86 and ARM hosts are little-endian
  out.append(bytes, sizeof(T));
}

/// Field \p number with wire type \p type (0 varint, 1 64-bit, 2 bytes, 5 32-bit).
void key(std::string &out, int number, int type) { varint(out, static_cast<uint64_t>(number) << 3 | type); }

void bytesField(std::string &out, int number, const std::string &bytes) {
  key(out, number, 2);
  varint(out, bytes.size());
  out += bytes;
}

double wallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// An Event with wall_time and step, plus \p rest (its other fields, encoded).
std::string event(int64_t step, const std::string &rest) {
  std::string e;
  key(e, 1, 1);
  littleEndian(e, wallTime());
  if (step != 0) {
    key(e, 2, 0);
    varint(e, static_cast<uint64_t>(step));
  }
  return e + rest;
}

} // namespace

uint32_t crc32c(const void *data, size_t size) {
  static const std::array<uint32_t, 256> table = crcTable();
  const auto *p = static_cast<const uint8_t *>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < size; ++i)
    c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string &logDir) {
  createDirectories(logDir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  filePath = joinPath(logDir, "events.out.tfevents." + std::to_string(static_cast<int64_t>(wallTime())) + "." +
                                  host + "." + std::to_string(::getpid()) + ".adapt");
  fd = ::open(filePath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw writeError(filePath, "open", errno);
  std::string version;
  bytesField(version, 3, "brain.Event:2");
  writeRecord(event(0, version));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd >= 0)
    ::close(fd);
}

void TensorBoardWriter::addScalars(int64_t step, const std::vector<std::pair<std::string, double>> &scalars) {
  std::string summary;
  for (const auto &[tag, value] : scalars) {
    std::string v;
    bytesField(v, 1, tag);
    key(v, 2, 5);
    littleEndian(v, static_cast<float>(value));
    bytesField(summary, 1, v);
  }
  std::string rest;
  bytesField(rest, 5, summary);
  writeRecord(event(step, rest));
}

void TensorBoardWriter::writeRecord(const std::string &data) {
  std::string frame;
  const uint64_t length = data.size();
  littleEndian(frame, length);
  littleEndian(frame, maskedCrc(frame.data(), sizeof length));
  frame += data;
  littleEndian(frame, maskedCrc(data.data(), data.size()));
  if (!writeAll(fd, frame))
    throw writeError(filePath, "write", errno);
}

} // namespace adapt::rt

//===- TensorBoard.h - scalar curves as TensorBoard event files -*- C++ -*-===//
//
// Users watch runs in TensorBoard; it reads event files of the documented
// TFRecord framing (length, masked CRC-32C of the length, an `Event`
// protobuf, masked CRC-32C of it). Only scalars are written (Event.step,
// Event.wall_time and Summary.Value.simple_value), so the few protobuf
// fields are encoded here instead of linking protobuf into the runtime, which
// the GPU machines' LibTorch-only build does not have.
//
// Each process writes its own file, OUT/tensorboard/events.out.tfevents.
// <seconds>.<host>.<pid>.adapt. A resumed run starts a new file; TensorBoard
// shows a resumed step's later value.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TENSORBOARD_H
#define ADAPT_RUNTIME_TENSORBOARD_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace adapt::rt {

/// CRC-32C (Castagnoli) of \p size bytes at \p data, as TFRecord frames use.
uint32_t crc32c(const void *data, size_t size);

/// An event file for one process's scalars.
class TensorBoardWriter {
public:
  /// Creates \p logDir and a new event file in it (its first record names the
  /// format version). Write failures throw RuntimeError (exit code 6).
  explicit TensorBoardWriter(const std::string &logDir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter &) = delete;
  TensorBoardWriter &operator=(const TensorBoardWriter &) = delete;

  /// One Event at \p step holding every (tag, value) of \p scalars, flushed
  /// to the file before returning.
  void addScalars(int64_t step, const std::vector<std::pair<std::string, double>> &scalars);

  /// The event file's path.
  const std::string &path() const { return filePath; }

private:
  void writeRecord(const std::string &event);
  std::string filePath;
  int fd = -1;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_TENSORBOARD_H

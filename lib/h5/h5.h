// The one checked layer over the HDF5 C API (Debian's parallel build, libhdf5-openmpi): RAII
// handles for files, groups, datasets and attributes. Every HDF5 call goes through here and is
// checked; a failure throws ucp::Error naming the file, the object path, the operation and HDF5's
// own error stack ("atoms.h5: /x.weight/fp32: H5Dread: H5Dread(): can't read data; ...").
// HDF5's printing of errors to stderr is turned off.
//
// The library is built without thread safety, so every call made here holds one process-wide
// mutex: handles may be used from several threads, one call at a time. With MPI-IO (a file created
// or opened with an MPI communicator) the usual parallel-HDF5 rules apply on top: creating groups
// and datasets and closing the file are collective; raw data transfers are independent.
//
// The header keeps <hdf5.h> (and with it <mpi.h>) out of the rest of ucp: ids are int64_t, as
// hid_t is in HDF5 1.10.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ucp::h5 {

// An HDF5 id and what it names (for messages); closed once, by the right H5*close.
class Object {
 public:
  enum class Type { None, File, Group, Dataset, Dataspace, Attribute, PropList, Datatype };
  Object() = default;
  Object(int64_t id, Type type, std::shared_ptr<const std::string> file, std::string path);
  ~Object();
  Object(Object&& other) noexcept;
  Object& operator=(Object&& other) noexcept;
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;

  int64_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  const std::string& file() const { return *file_; }
  const std::string& path() const { return path_; }  // HDF5 path inside the file ("/", "/a.b/fp32")
  // Closes now, checked (the destructor closes too, but cannot report a failure).
  void Close();

  // Attributes (on a file's root group, a group or a dataset). Strings are fixed-length UTF-8, NUL-padded;
  // integers 64-bit little-endian. Setting replaces an attribute of the same name.
  bool HasAttribute(const std::string& name) const;
  void SetAttribute(const std::string& name, int64_t value) const;
  void SetAttribute(const std::string& name, const std::string& value) const;
  void SetAttribute(const std::string& name, std::span<const int64_t> values) const;  // 1-D
  void SetAttribute(const std::string& name, const std::vector<std::string>& values) const;  // 1-D
  // A scalar of one of the numeric types below (the step: float32, float64 or int64).
  enum class Numeric { F32, F64, I64 };
  void SetScalarAttribute(const std::string& name, Numeric type, const void* value) const;

  int64_t IntAttribute(const std::string& name) const;
  std::string StringAttribute(const std::string& name) const;
  std::vector<int64_t> IntsAttribute(const std::string& name) const;
  std::vector<std::string> StringsAttribute(const std::string& name) const;
  // The scalar's type and 8 bytes holding its value (as the type's native representation).
  Numeric ScalarAttribute(const std::string& name, void* value8) const;

 protected:
  std::string Where() const;  // "file: path"
  int64_t id_ = -1;
  Type type_ = Type::None;
  std::shared_ptr<const std::string> file_ = std::make_shared<std::string>();
  std::string path_;
};

class Dataset;

class Group : public Object {
 public:
  using Object::Object;
  Group() = default;
  Group(Object&& o) : Object(std::move(o)) {}
  Group CreateGroup(const std::string& name) const;
  Group OpenGroup(const std::string& name) const;
  bool HasLink(const std::string& name) const;  // a direct member of this group
  std::vector<std::string> Members() const;     // names of the direct members, in name order

  // A float32 (little-endian) dataset of `shape` (empty: a scalar), chunked by `chunk` when it is
  // non-empty (same rank as shape), else contiguous; space allocated at creation, no fill values.
  Dataset CreateFloatDataset(const std::string& name, const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& chunk) const;
  Dataset OpenDataset(const std::string& name) const;
  void Unlink(const std::string& name) const;  // removes a member (tests damage files with it)
};

class Dataset : public Object {
 public:
  using Object::Object;
  Dataset() = default;
  Dataset(Object&& o) : Object(std::move(o)) {}
  std::vector<int64_t> Shape() const;
  bool IsFloat32() const;                   // a little-endian IEEE float32 dataset
  std::vector<int64_t> ChunkShape() const;  // empty when not chunked
  // The whole dataset from / into row-major float32 memory (independent transfer under MPI-IO).
  void WriteAll(const float* data) const;
  // The hyperslab [start, start + count) into row-major memory of the slab's shape: one H5Dread.
  void ReadSlab(std::span<const int64_t> start, std::span<const int64_t> count, float* dst) const;
};

class File : public Group {
 public:
  File() = default;
  // Creates (truncating) `path`. With mpi_comm (a pointer to an MPI_Comm) the file is opened through
  // MPI-IO and the call is collective over that communicator; else the POSIX driver.
  static File Create(const std::string& path, const void* mpi_comm = nullptr);
  static File Open(const std::string& path, bool writable, const void* mpi_comm = nullptr);
  // Flushes and closes, checked; collective under MPI-IO.
  void CloseFile() { Close(); }
  // The file's size as HDF5 has allocated it so far (its end of address space).
  int64_t Size() const;
  // Lets go of the file without closing it: for a file written through MPI-IO that a failure
  // abandons. Closing it flushes metadata, collectively; a rank whose flush fails (a full disk)
  // leaves the collective, and the others wait in it for ever. The temporary is removed instead.
  void Abandon();

 private:
  using Group::Group;
};

// Starts HDF5 before MPI_Init, without its exit hook. Started after MPI_Init, HDF5 closes what is
// still open inside MPI_Finalize, and started at all, at exit: an abandoned file (above) would be
// flushed collectively then, and hang the job it was abandoned to save.
void InitializeBeforeMpi();

// HDF5 ids open in this process (files, groups, datasets, attributes, ...): 0 once every handle is
// gone, whatever failed on the way (the tests check that errors leave nothing open).
int64_t OpenIdCount();

// HDF5's version, "1.10.8".
std::string LibraryVersion();

}  // namespace ucp::h5

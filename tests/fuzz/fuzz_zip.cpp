// The zip container of .pt files: central directory, zip64 records, every entry's payload and CRC.
#include "fuzz_support.h"
#include "pt/zip_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ucp::fuzz::Run([&] {
    ucp::pt::ZipArchive zip(ucp::MappedFile::Open(ucp::fuzz::AsFile(data, size, "input.zip")));
    for (const auto& [name, entry] : zip.entries()) {
      (void)zip.Payload(entry);
      try {
        zip.VerifyCrc(entry);
      } catch (const ucp::Error&) {
      }
    }
  });
}

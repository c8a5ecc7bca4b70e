-- Documents that are not plain text: uploaded files and URLs. Their source keeps the raw bytes
-- (or the URL) and, once the regularize job has run, the extracted text in `content`.
--
-- content_hash: what was ingested (the text, the bytes, or the URL), equal to the item's
--   content_hash while this version is current.
-- text_hash: the text now in `content`. OCR replaces a placeholder with the recognized text;
--   a job that read the older text sees the change and leaves its stale result unwritten.
ALTER TABLE sources ADD COLUMN content_hash text;
ALTER TABLE sources ADD COLUMN text_hash text;
ALTER TABLE sources ADD COLUMN meta jsonb NOT NULL DEFAULT '{}'::jsonb;
UPDATE sources
SET content_hash = encode(sha256(convert_to(content, 'UTF8')), 'hex'), text_hash = encode(sha256(convert_to(content, 'UTF8')), 'hex')
WHERE content IS NOT NULL;

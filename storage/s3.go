package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// preflightTimeout bounds the whole S3 check.
const preflightTimeout = 20 * time.Second

// Preflight checks that the S3 endpoint answers, that the keys are accepted,
// that the bucket exists (making it when CreateBucket is set) and that the
// keys may write, read and delete in it. It returns one actionable line
// when something is wrong. It is called before `juicefs format`.
func Preflight(ctx context.Context, s3 S3Config, sec Secrets) error {
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	u, err := url.Parse(s3.Endpoint)
	if err != nil {
		return fmt.Errorf("s3 endpoint %q: %w", s3.Endpoint, err)
	}
	cl, err := minio.New(u.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(sec.AccessKey, sec.SecretKey, ""),
		Secure:       u.Scheme == "https",
		Region:       s3.Region,
		BucketLookup: minio.BucketLookupPath,
		MaxRetries:   1,
	})
	if err != nil {
		return fmt.Errorf("s3 endpoint %s: %w", s3.Endpoint, err)
	}
	explain := func(op string, err error) error { return s3Error(s3, op, err) }

	// A server that is starting answers 503 for a while: wait for it
	// within the preflight deadline.
	for {
		err = listOne(ctx, cl, s3.Bucket)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	if err != nil && minio.ToErrorResponse(err).Code == "NoSuchBucket" && s3.CreateBucket {
		if err := cl.MakeBucket(ctx, s3.Bucket, minio.MakeBucketOptions{Region: s3.Region}); err != nil {
			switch minio.ToErrorResponse(err).Code {
			case "BucketAlreadyOwnedByYou", "BucketAlreadyExists":
			default:
				return explain("create bucket", err)
			}
		}
		err = listOne(ctx, cl, s3.Bucket)
	}
	if err != nil {
		return explain("list bucket", err)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	key := "den-preflight/" + hex.EncodeToString(rnd[:])
	body := []byte("den storage preflight\n")
	if _, err := cl.PutObject(ctx, s3.Bucket, key, bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
		return explain("write object", err)
	}
	if _, err := cl.StatObject(ctx, s3.Bucket, key, minio.StatObjectOptions{}); err != nil {
		return explain("read object", err)
	}
	if err := cl.RemoveObject(ctx, s3.Bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return explain("delete object", err)
	}
	return nil
}

func listOne(ctx context.Context, cl *minio.Client, bucket string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for obj := range cl.ListObjects(ctx, bucket, minio.ListObjectsOptions{MaxKeys: 1}) {
		if obj.Err != nil {
			return obj.Err
		}
		break
	}
	return ctx.Err()
}

// retryable tells a server that is starting or overloaded.
func retryable(err error) bool {
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "XMinioServerNotInitialized", "ServiceUnavailable", "SlowDown", "XMinioServerBusy":
		return true
	}
	return resp.StatusCode == 503
}

// s3Error turns an S3 or network error into one line that says what to fix.
func s3Error(s3 S3Config, op string, err error) error {
	where := fmt.Sprintf("s3 %s at %s", s3.Bucket, s3.Endpoint)
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %s: no answer within %s: check the endpoint and that the server is up: %w", where, op, preflightTimeout, err)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("%s: endpoint host %q not found: check s3.endpoint: %w", where, dnsErr.Name, err)
	case errors.As(err, &opErr):
		return fmt.Errorf("%s: endpoint unreachable (is the S3 server running, is s3.endpoint right?): %w", where, opErr)
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "InvalidAccessKeyId":
		return fmt.Errorf("%s: access key rejected: check access_key in the secrets file: %w", where, err)
	case "SignatureDoesNotMatch":
		return fmt.Errorf("%s: secret key rejected: check secret_key in the secrets file: %w", where, err)
	case "NoSuchBucket":
		return fmt.Errorf("%s: bucket %q does not exist: create it or set s3.create_bucket: %w", where, s3.Bucket, err)
	case "AccessDenied":
		return fmt.Errorf("%s: %s: permission denied: grant these keys list, read, write and delete on bucket %q: %w", where, op, s3.Bucket, err)
	case "XMinioServerNotInitialized", "ServiceUnavailable", "SlowDown", "XMinioServerBusy":
		return fmt.Errorf("%s: %s: server not ready after %s: %w", where, op, preflightTimeout, err)
	case "InvalidBucketName":
		return fmt.Errorf("%s: invalid bucket name %q: %w", where, s3.Bucket, err)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return fmt.Errorf("%s: %s: endpoint unreachable or not S3: %w", where, op, err)
	}
	return fmt.Errorf("%s: %s: %w", where, op, err)
}
